"""A cell that prints or displays faster than the gateway reads waits for it.

ipykernel sends iopub on a PUB-like socket (XPUB), which never blocks: past
its send HWM it drops. We used to raise the HWM to 100,000 messages so that
nothing was dropped, which left a flood unbounded on the kernel's side: a
print loop ran at full speed (a whole core) however slowly the gateway read,
and its unread output piled up in the kernel's memory. On a shared host that
core is the other sessions' latency.

Three bounds make the gateway's reading pace the kernel instead:

- the iopub socket is set ``XPUB_NODROP`` with a send HWM of
  :data:`IOPUB_SEND_HWM` messages: past it a send blocks (in ipykernel's IOPub
  thread) until the gateway has read, instead of dropping or queueing more;
- ``sys.stdout``/``sys.stderr`` writes of the main thread (the cell's code)
  wait, once :data:`STREAM_PENDING_CHARS` are buffered, until what they wrote
  has been sent (ipykernel buffers writes and sends them from its IOPub thread,
  so a blocked IOPub thread alone would only move the pile into its buffer);
- other messages the main thread sends (displays, results, errors) wait once
  :data:`PENDING_SENDS` are queued for the IOPub thread.

Only the main thread waits: the IOPub thread must go on sending, and the
control thread must stay free to answer an interrupt. A wait is a plain
``threading.Event`` wait, which a SIGINT (an interrupt) ends with
``KeyboardInterrupt`` like any other line of the cell. When nobody reads (no
gateway is connected) nothing waits: XPUB drops for peers that are not there.
"""

from __future__ import annotations

import threading
from typing import Any

IOPUB_SEND_HWM = 32
"""Messages the kernel queues for the gateway before a send blocks. Stream text
is sent in slices of at most 256 KiB (`launcher.MAX_STREAM_CHARS`), so at most
8 MiB wait here, and usually far less (the gateway reads at once when it can).
With 256 a print loop had written 32 MB before it first waited."""
STREAM_PENDING_CHARS = 1 << 20
"""Characters a stream may buffer before the writing cell waits for its flush."""
PENDING_SENDS = 256
"""Messages queued for the IOPub thread before the sending cell waits."""
FEATURE = "kernelgw: iopub waits for its reader"
"""Added to kernel_info's ``supported_features``: the gateway reads a kernel's
output at a bounded pace only when it knows the kernel waits for it (from any
other, unread output would be dropped past its HWM)."""
WAIT_STEP_S = 1.0
"""A waiting cell checks this often that it should still wait (it never gives up:
it waits for the gateway, which reads on, or for an interrupt)."""


def bound_iopub_socket(socket: Any) -> None:
    """Blocking sends past `IOPUB_SEND_HWM` on the iopub socket (before it binds)."""
    import zmq

    if socket.getsockopt(zmq.TYPE) != zmq.XPUB:
        return
    socket.setsockopt(zmq.XPUB_NODROP, 1)
    socket.setsockopt(zmq.SNDHWM, IOPUB_SEND_HWM)


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def wait_until_sent(pub_thread: Any, before: Any = None) -> None:
    """Wait until the IOPub thread has done everything queued so far (after
    ``before``, if given, which it runs first)."""
    if not pub_thread.thread.is_alive():
        return
    if before is not None:
        pub_thread.schedule(before)
    done = threading.Event()
    pub_thread.schedule(done.set)
    while not done.wait(WAIT_STEP_S):
        if not pub_thread.thread.is_alive():
            return


class BoundedWrites:
    """One OutStream's ``write``, waiting for its flush once the cell has written
    `STREAM_PENDING_CHARS` since it last waited."""

    def __init__(self, stream: Any, limit: int = STREAM_PENDING_CHARS) -> None:
        self.stream = stream
        self.limit = limit
        self.pending = 0
        self.waits = 0
        self._write = stream.write

    def write(self, string: str) -> Any:
        written = self._write(string)
        self.pending += len(string)
        if self.pending > self.limit and _on_main_thread():
            self.pending = 0
            self.waits += 1
            wait_until_sent(self.stream.pub_thread, self.stream._flush)
        return written


class BoundedSends:
    """An IOPubThread's ``send_multipart``, waiting once `PENDING_SENDS` messages
    are queued for it."""

    def __init__(self, pub_thread: Any, limit: int = PENDING_SENDS) -> None:
        self.pub_thread = pub_thread
        self.limit = limit
        self.waits = 0
        self._send = pub_thread.send_multipart

    def send_multipart(self, *args: Any, **kwargs: Any) -> Any:
        sent = self._send(*args, **kwargs)
        if len(self.pub_thread._events) > self.limit and _on_main_thread():
            self.waits += 1
            wait_until_sent(self.pub_thread)
        return sent


def bound_outputs(pub_thread: Any, streams: Any) -> None:
    """Install the waits on the kernel's IOPub thread and its output streams (once)."""
    if pub_thread is None or not hasattr(pub_thread, "_events"):
        return  # not the ipykernel we know: leave it as it is
    if not isinstance(getattr(pub_thread.send_multipart, "__self__", None), BoundedSends):
        pub_thread.send_multipart = BoundedSends(pub_thread).send_multipart
    for stream in streams:
        if getattr(stream, "pub_thread", None) is None or not hasattr(stream, "_flush"):
            continue
        if not isinstance(getattr(stream.write, "__self__", None), BoundedWrites):
            stream.write = BoundedWrites(stream).write


def advertising(kernel_class: Any) -> Any:
    """``kernel_class`` whose kernel_info lists `FEATURE` in ``supported_features``."""
    if getattr(kernel_class, "kernelgw_waits", False):
        return kernel_class

    class Waiting(kernel_class):  # type: ignore[misc]
        kernelgw_waits = True

        @property
        def kernel_info(self) -> dict[str, Any]:
            info = dict(super().kernel_info)
            info["supported_features"] = [*info.get("supported_features", []), FEATURE]
            return info

    Waiting.__name__ = Waiting.__qualname__ = kernel_class.__name__
    return Waiting
