"""A kernel's signed messages, read off its ZMQ socket a burst at a time.

jupyter_client's channels take two awaits per message (a poll, then a receive)
and parse the dates of every header with dateutil: on ``1+1`` that was most of
what the gateway spent reading a cell's five messages, on the event loop. This
reader waits once, then takes whatever else the socket already holds without
waiting, and checks and decodes each message itself: the HMAC signature
(with the session's own HMAC, ``Session.auth``, so the key and scheme stay
the session's), signatures seen before (a replayed message is refused, as
jupyter_client does), and the JSON with orjson. Dates stay the strings the
kernel sent: the gateway reads no message's date, and a Jupyter client gets
the kernel's own.

Messages of protocol versions before 5 are not adapted (jupyter_client's
``adapt``): every kernel the gateway starts speaks 5.x.
"""

from __future__ import annotations

import asyncio
import collections
import hmac
import json
import os
import time
from collections.abc import Callable
from typing import Any, cast

import orjson
import zmq
import zmq.asyncio
from jupyter_client.session import DELIM, Session

from kernelgw.runtime import allocator

MAX_BATCH = 64
"""Most messages one read takes, so a flood is handed over in bounded slices
(64 small displays: about 2 ms of the event loop with what is done with them)."""
MAX_BATCH_BYTES = 256 << 10
"""One read stops taking more once it holds this many bytes (a message may be
bigger; the Python kernel sends no stream message over 256 KiB)."""
COALESCE_MAX_CHARS = 1 << 20
"""Largest stream text `coalesce_streams` makes from several messages."""
POLLIN = int(zmq.POLLIN)
"""As a plain int: pyzmq's flag enums cost a call per operation."""
EVENTS = int(zmq.EVENTS)
NOBLOCK = int(zmq.NOBLOCK)
SNDMORE = int(zmq.SNDMORE)
SIGNATURES_REMEMBERED = 1 << 16
"""Signatures kept to refuse a replayed message (jupyter_client keeps as many)."""


class InvalidKernelMessage(ValueError):
    """A message that is not well-formed or not correctly signed."""


class ReaderClosed(RuntimeError):
    """A `KernelMessageReader` was closed while a read waited on it."""


class SignatureHistory:
    """The latest signatures seen, oldest forgotten first."""

    def __init__(self, size: int = SIGNATURES_REMEMBERED) -> None:
        self._size = size
        self._seen: collections.OrderedDict[bytes, None] = collections.OrderedDict()

    def add(self, signature: bytes) -> bool:
        """Remember ``signature``; False when it was seen already."""
        if signature in self._seen:
            return False
        self._seen[signature] = None
        if len(self._seen) > self._size:
            self._seen.popitem(last=False)
        return True


TEXT_CHECKED = "text_checked"
"""Set (True) in a decoded message whose metadata and content orjson parsed: then
no string in them holds a surrogate (orjson refuses JSON with a lone one), and
events made of them skip that check (`kernelgw.events.TEXT_CHECKED`)."""


def _parsed(part: bytes, what: str) -> tuple[dict[str, Any], bool]:
    """The JSON object, and whether orjson parsed it (see `TEXT_CHECKED`)."""
    try:
        value = orjson.loads(part)
        checked = True
    except orjson.JSONDecodeError:
        # JSON with an escaped lone surrogate, which orjson refuses: parsed as
        # jupyter_client does, and cleaned where events are made
        try:
            value = json.loads(part.decode("utf-8", "replace"))
        except ValueError as exc:
            raise InvalidKernelMessage(f"{what} is not JSON ({exc})") from None
        checked = False
    if not isinstance(value, dict):
        raise InvalidKernelMessage(f"{what} is not an object")
    return value, checked


def _object(part: bytes, what: str) -> dict[str, Any]:
    return _parsed(part, what)[0]


SkipContent = Callable[[str, str | None], bool]
"""(msg_type, parent msg_id) -> True when nobody will read the message's content."""


def decode(
    frames: list[bytes], auth: hmac.HMAC | None, history: SignatureHistory, skip_content: SkipContent | None = None
) -> dict[str, Any]:
    """One multipart message as jupyter_client's ``deserialize`` gives it (header,
    parent_header, metadata, content, buffers, msg_id, msg_type), dates left as sent.
    ``auth``: the session's ``Session.auth`` (None: messages are not signed), taken
    once by the caller: it is a traitlets attribute, slow to read for every message.
    ``skip_content``: when it says so, metadata and content are left undecoded
    (empty) and buffers dropped: the output of a cell past its output cap is
    still checked, but costs no JSON decoding."""
    try:
        start = frames.index(DELIM) + 1
    except ValueError:
        raise InvalidKernelMessage("no delimiter frame") from None
    parts = frames[start:]
    if len(parts) < 5:
        raise InvalidKernelMessage(f"{len(parts)} frames after the delimiter, not at least 5")
    signature = parts[0]
    if auth is not None:
        if not signature:
            raise InvalidKernelMessage("unsigned message")
        mac = auth.copy()
        for part in parts[1:5]:
            mac.update(part)
        if not hmac.compare_digest(signature, mac.hexdigest().encode()):
            raise InvalidKernelMessage("invalid signature")
        if not history.add(signature):
            raise InvalidKernelMessage("a signature seen before (a replayed message)")
    header = _object(parts[1], "header")
    msg_id, msg_type = header.get("msg_id"), header.get("msg_type")
    if not isinstance(msg_id, str) or not isinstance(msg_type, str):
        raise InvalidKernelMessage("header without a msg_id and msg_type")
    parent_header = _object(parts[2], "parent_header")
    if skip_content is not None and skip_content(msg_type, parent_header.get("msg_id")):
        return {
            "header": header,
            "msg_id": msg_id,
            "msg_type": msg_type,
            "parent_header": parent_header,
            "metadata": {},
            "content": {},
            "buffers": [],
            "content_skipped": True,
        }
    metadata, metadata_checked = _parsed(parts[3], "metadata")
    content, content_checked = _parsed(parts[4], "content")
    return {
        "header": header,
        "msg_id": msg_id,
        "msg_type": msg_type,
        "parent_header": parent_header,
        "metadata": metadata,
        "content": content,
        "buffers": [memoryview(b) for b in parts[5:]],
        TEXT_CHECKED: metadata_checked and content_checked,
    }


def _stream_text(msg: dict[str, Any]) -> str | None:
    text = msg["content"].get("text")
    return text if msg["msg_type"] == "stream" and isinstance(text, str) else None


def coalesce_streams(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Runs of stream messages of one request and one stream, read together, as one
    message each (up to `COALESCE_MAX_CHARS`): a print loop's flood costs the gateway,
    the history and every watcher one event per read instead of one per flush.
    Nothing else is merged or reordered; the first message of a run carries it."""
    out: list[dict[str, Any]] = []
    run: list[str] = []  # the texts of out[-1] while it is a stream run
    for msg in messages:
        text = _stream_text(msg)
        if run and text is not None:
            head = out[-1]
            if (
                head["parent_header"].get("msg_id") == msg["parent_header"].get("msg_id")
                and head["content"].get("name") == msg["content"].get("name")
                and sum(map(len, run)) + len(text) <= COALESCE_MAX_CHARS
            ):
                run.append(text)
                if not msg.get(TEXT_CHECKED):
                    head[TEXT_CHECKED] = False  # the joined text is as checked as its least checked part
                continue
        if len(run) > 1:
            out[-1]["content"]["text"] = "".join(run)
        out.append(msg)
        run = [text] if text is not None else []
    if len(run) > 1:
        out[-1]["content"]["text"] = "".join(run)
    return out


class KernelMessageReader:
    """Reads one socket of a kernel; invalid messages go to ``on_invalid`` and are dropped.

    It waits for the socket itself rather than through pyzmq's asyncio futures,
    which on ``1+1`` cost about 60 us of the event loop per message (a future,
    its bookkeeping and flag enums per receive): the event loop watches a
    duplicate of the socket's ZMQ file descriptor (its own registration, beside
    any pyzmq keeps on the original), and ``ZMQ_EVENTS`` says whether a message
    is there. That descriptor only signals a change, and a send on the same
    socket can consume the signal of a message that arrived meanwhile: whoever
    sends on the socket calls `wake` after (`KernelMessageSender` does, given
    the reader). `close` once the reader is done."""

    def __init__(
        self,
        socket: zmq.asyncio.Socket,
        session: Session,
        on_invalid: Callable[[InvalidKernelMessage], None],
        max_batch: int = MAX_BATCH,
        max_batch_bytes: int = MAX_BATCH_BYTES,
        skip_content: SkipContent | None = None,
    ) -> None:
        # the same ZMQ socket, used without futures
        self._now: zmq.Socket[bytes] = zmq.Socket.shadow(socket.underlying)
        self._auth = session.auth
        self._history = SignatureHistory()
        self._on_invalid = on_invalid
        self._max_batch = max_batch
        self._max_batch_bytes = max_batch_bytes
        self._skip_content = skip_content
        self.last_bytes = 0
        """Bytes of the frames of the latest batch (as received, valid or not)."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._fd = -1
        """The duplicate of the socket's file descriptor the loop watches (-1: none yet, or closed)."""
        self._waiter: asyncio.Future[None] | None = None
        self._look = True
        """The socket may hold a message: ask it before waiting. False once asked and
        it held none; from then on a message that arrives signals (`wake`)."""
        self.busy_since = 0.0
        """The thread's CPU time (`time.thread_time`) when the latest batch arrived:
        its reading and decoding, and what the caller does with it, took the event
        loop since (CPU time: a process the machine preempted is not charged)."""

    def _ready(self) -> bool:
        # a few us per call (pyzmq makes an enum of the option): asked only where needed
        return bool(cast(int, self._now.getsockopt(EVENTS)) & POLLIN)

    def wake(self) -> None:
        """Resolve a waiting `batch` if a message is there: the loop calls it when
        the socket's descriptor signals, and a sender on the same socket after a send."""
        waiter = self._waiter
        try:
            # asked even with nobody waiting: reading the events is what resets the signal
            ready = self._ready()
        except zmq.ZMQError as exc:  # the socket was closed under the reader
            if waiter is not None and not waiter.done():
                waiter.set_exception(exc)
            self.close()
            return
        if not ready:
            return
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        else:
            self._look = True

    async def _readable(self) -> None:
        """Return once a message is there: at once if it may be (`_look`), else when
        `wake` saw one."""
        if self._fd < 0:
            loop = self._loop = asyncio.get_running_loop()
            self._fd = os.dup(cast(int, self._now.getsockopt(zmq.FD)))
            loop.add_reader(self._fd, self.wake)
        if self._look:
            self._look = False
            if self._ready():
                return
        assert self._loop is not None
        waiter = self._waiter = self._loop.create_future()
        try:
            await waiter
        except BaseException:
            # cancelled (a caller's timeout): `wake` may have answered the waiter
            # meanwhile, taking the socket's signal with it, and ZMQ signals no
            # more while the message it saw is unread: the next read must ask
            self._look = True
            raise
        finally:
            self._waiter = None

    def _recv(self) -> list[bytes]:
        """One multipart message, with plain int flags and without asking ``RCVMORE``
        (``recv_multipart`` makes an enum for each frame)."""
        sock = self._now
        frame = sock.recv(NOBLOCK, copy=False)
        frames = [frame.bytes]
        while frame.more:
            frame = sock.recv(NOBLOCK, copy=False)
            frames.append(frame.bytes)
        return frames

    async def batch(self) -> list[dict[str, Any]]:
        """The next messages: waits for one, then takes what is already queued, up to
        ``max_batch`` messages or ``max_batch_bytes``."""
        while True:
            await self._readable()
            self.busy_since = time.thread_time()
            received: list[list[bytes]] = []
            size = 0
            while True:
                try:
                    frames = self._recv()
                except zmq.Again:
                    # the receive processed the socket's commands, which may have
                    # taken the signal of a message arriving meanwhile: ask again
                    self._look = True
                    break
                received.append(frames)
                size += sum(map(len, frames))
                # asked first: a receive that finds nothing raises, which costs more
                if not self._ready():
                    break
                if len(received) >= self._max_batch or size >= self._max_batch_bytes:
                    self._look = True  # the rest is for the next read
                    break
            allocator.note_received(size)
            self.last_bytes = size
            messages = []
            for frames in received:
                try:
                    messages.append(decode(frames, self._auth, self._history, self._skip_content))
                except InvalidKernelMessage as exc:
                    self._on_invalid(exc)
            if messages:
                return messages

    def close(self) -> None:
        """Stop watching the socket (the socket itself is its owner's to close)."""
        if self._fd >= 0:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(ReaderClosed("the kernel message reader was closed"))


class KernelMessageSender:
    """Sends on one socket of a kernel what jupyter_client's ``Session.send`` would
    (the message serialised and signed by the session), without what that costs
    per message on the event loop: a new shadow socket, and flag enums per frame
    (about 40 us of a ``1+1``). Blocks as that does when ZMQ's queue is full.

    ``reader``: the `KernelMessageReader` of the same socket, woken after every
    send (a send can take the signal of a message that arrived meanwhile), so
    that no sender can forget to."""

    def __init__(self, socket: zmq.asyncio.Socket, session: Session, reader: KernelMessageReader | None = None) -> None:
        self._sock: zmq.Socket[bytes] = zmq.Socket.shadow(socket.underlying)
        self._session = session
        self._reader = reader

    def send(self, msg: dict[str, Any]) -> None:
        """Send ``msg`` as ``Session.msg`` makes it, its ``buffers`` (if any) after it."""
        frames: list[Any] = self._session.serialize(msg)
        frames.extend(msg.get("buffers") or ())
        sock = self._sock
        last = len(frames) - 1
        for i, frame in enumerate(frames):
            sock.send(frame, SNDMORE if i < last else 0)
        if self._reader is not None:
            self._reader.wake()

    def request(self, msg_type: str, content: dict[str, Any] | None = None) -> str:
        """A new ``msg_type`` request, as ``Session.msg`` makes it; returns its msg_id."""
        msg = self._session.msg(msg_type, content)
        self.send(msg)
        return cast(str, msg["header"]["msg_id"])

    def kernel_info(self) -> str:
        """A ``kernel_info_request`` as ``KernelClient.kernel_info`` sends it; returns its msg_id."""
        return self.request("kernel_info_request")

    def execute(
        self,
        code: str,
        *,
        silent: bool,
        store_history: bool,
        user_expressions: dict[str, str],
        stop_on_error: bool = True,
    ) -> str:
        """An ``execute_request`` as ``KernelClient.execute`` sends it (stdin not
        allowed); returns its msg_id."""
        content = {
            "code": code,
            "silent": silent,
            "store_history": store_history,
            "user_expressions": user_expressions,
            "allow_stdin": False,
            "stop_on_error": stop_on_error,
        }
        return self.request("execute_request", content)
