"""Out-of-memory kills counted per container from the engine's ``oom`` events.

Why not the engine's ``State.OOMKilled`` flag (Docker 20.10): it is decided once,
when the engine handles the container's exit, from whether an out-of-memory
event of that container came before. So it is sticky (one out-of-memory kill
of any process in the container, say a subprocess the kernel survived, marks
every later exit of it, a ``kill -9`` too) and it can miss: under gVisor the
shim sometimes sends the exit before the ``oom`` event (seen here: ``die``, then
``oom`` 60 ms later, ``OOMKilled`` false for good), which is how the memory bomb
was once reported "killed by signal 9". The ``oom`` event itself always comes.

So the backend counts these events as they arrive, and a kernel's exit is an
out-of-memory kill when the count rose after the caller last saw the kernel
alive (`KernelState.oom_kills`, `Backend.state`'s ``oom_seen``): a kill of the
kernel is named for what happened during its cell, not before.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable
from typing import Any

import docker
import docker.errors

from kernelgw.runtime.backends.labels import LABEL_GATEWAY

log = logging.getLogger(__name__)

RESUBSCRIBE_S = 1.0
"""Pause before subscribing again after the engine's event stream broke."""


class OomCounter:
    """The ``oom`` events of one gateway's containers, by container id. A thread
    reads the engine's event stream (it blocks); `count` never blocks."""

    def __init__(self, gateway_name: str, client: Callable[[], docker.DockerClient]) -> None:
        self.gateway_name = gateway_name
        self._client = client
        self._counts: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()
        """Guards the counts and the stream; held only briefly."""
        self._subscribing = threading.Lock()
        self._stream: Any = None
        self._thread: threading.Thread | None = None
        self._closed = threading.Event()

    @property
    def watching(self) -> bool:
        """Subscribed to the engine's events: counts are complete from then on."""
        return self._stream is not None

    def ensure_watching(self) -> None:
        """Subscribe (blocking, once; again after a break). Called before a kernel
        container starts, so none of its events can come before the subscription:
        the engine has taken it once its answer's headers arrived. The counts' lock
        is not held meanwhile: `count` runs on the event loop."""
        with self._subscribing:
            if self._stream is not None or self._closed.is_set():
                return
            stream = self._subscribe()
            with self._lock:
                self._stream = stream
            if self._closed.is_set():  # closed while subscribing
                stream.close()
                return
            if self._thread is None:
                self._thread = threading.Thread(target=self._read, name=f"oom-events-{self.gateway_name}", daemon=True)
                self._thread.start()

    def _subscribe(self) -> Any:
        filters = {"type": ["container"], "event": ["oom"], "label": [f"{LABEL_GATEWAY}={self.gateway_name}"]}
        return self._client().events(decode=True, filters=filters)

    def count(self, container_id: str) -> int:
        """The container's out-of-memory events so far."""
        with self._lock:
            return self._counts[container_id]

    def forget(self, container_id: str) -> None:
        """The container is gone: its count is no longer asked for."""
        with self._lock:
            self._counts.pop(container_id, None)

    def _read(self) -> None:
        while not self._closed.is_set():
            stream = self._stream
            try:
                if stream is not None:
                    for event in stream:
                        container = event.get("id") or (event.get("Actor") or {}).get("ID")
                        if event.get("Action") == "oom" and isinstance(container, str):
                            with self._lock:
                                self._counts[container] += 1
            except Exception as exc:  # the engine went away or the stream broke
                if not self._closed.is_set():
                    log.warning("the engine's event stream broke (%s); out-of-memory kills may be missed", exc)
            with self._lock:
                if self._stream is stream:
                    self._stream = None  # not watching: the engine's flag decides meanwhile
            if self._closed.wait(RESUBSCRIBE_S):
                return
            try:
                self.ensure_watching()
            except docker.errors.DockerException as exc:
                log.warning("subscribing to the engine's events failed: %s", exc)

    def close(self) -> None:
        """Stop reading (blocking: joins the reader)."""
        self._closed.set()
        with self._lock:
            stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()
        if self._thread is not None:
            self._thread.join(timeout=5)
