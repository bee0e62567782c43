"""The kernel's entry point: ipykernel with high-water marks fit for floods, a
message packer that cannot fail on a lone surrogate, and bounded tracebacks.

ZMQ's default send HWM (1000 messages per peer) makes the kernel's PUB socket
drop output silently when a cell prints or displays faster than the gateway
reads for a moment (10,000 displays lost about 5% of them). The kernel's
sockets send with a 100,000 HWM, except iopub, which now never drops and
blocks instead past a small HWM: a flood waits for the gateway's reading
(:mod:`kernelgw_kernel.backpressure`).

A Python string may hold a lone surrogate (``'\\ud800'``), which UTF-8 cannot
encode. jupyter_client's packer then raises (``UnicodeEncodeError``, also from
its own fallback): a ``print`` of one lost the cell's whole stdout buffer (the
flush failed in ipykernel's IOPub thread), a display of one raised into the
cell, and an exception whose message held one sent no error at all.
:func:`guarded` falls back to :func:`json_packer`, which replaces each
surrogate with U+FFFD, so the message, and everything else in it, is sent.

IPython's traceback formatter (ultratb, with stack_data) looks up every frame's
module and source (``inspect.getmodule`` scans ``sys.modules`` for each frame of
cell code), and IPython 9 formats a failed cell's exception twice: to show it
and to store it in its history. A RecursionError at the default limit (3,000
frames) took 4 s; with ``sys.setrecursionlimit(100000)`` the cell ran into its
timeout while IPython was still formatting, and the kernel was restarted.
:class:`TracebackLimiter` wraps both: before IPython formats an exception,
every traceback of it (its chain of causes and contexts and the members of
exception groups, at most :data:`MAX_EXCEPTIONS` of them) is replaced, for the
time of the formatting only, by one of at most :data:`MAX_FRAMES` entries: the
first :data:`HEAD_FRAMES` and the last :data:`TAIL_FRAMES` frames (new
``TracebackType`` objects over the same frames; the exception objects are
restored afterwards, and ``sys.last_traceback`` keeps every frame for
``%debug``). The text IPython made is then capped (:data:`MAX_ENTRY_CHARS` per
entry, :data:`MAX_TRACEBACK_CHARS` in all) and says what was left out.
``ename`` and ``evalue`` are not touched.
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
from collections import deque
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

SEND_HWM = 100_000
MAX_STREAM_CHARS = 256 * 1024
"""Most text one stream message carries. ipykernel sends what a cell wrote
within its flush interval (0.2 s) as one message: a print loop at full speed
made 5 MB messages, and one ``print`` of a 100 MB string one of 100 MB, which
the gateway must check and decode whole, on its event loop, while the other
sessions wait. Slices of this size interleave with everyone else's messages."""
_SURROGATE = re.compile("[\ud800-\udfff]")


def json_packer(obj: Any) -> bytes:
    """jupyter_client's ``json_packer``, but any surrogate code point becomes
    U+FFFD instead of failing the message (valid UTF-8 always)."""
    from jupyter_client.session import json_clean, json_default  # type: ignore[attr-defined]

    try:
        text = json.dumps(obj, default=json_default, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError):
        text = json.dumps(json_clean(obj), default=json_default, ensure_ascii=False, allow_nan=False)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", text).encode("utf-8")


def guarded(pack: Any) -> Any:
    """``pack`` (the session's packer), falling back to :func:`json_packer` when
    it fails: the usual path stays as fast as it was."""

    def pack_or_replace(obj: Any) -> bytes:
        try:
            packed: bytes = pack(obj)
        except (TypeError, ValueError):  # UnicodeEncodeError is a ValueError
            return json_packer(obj)
        return packed

    return pack_or_replace


HEAD_FRAMES = 10
"""Outermost frames kept: the cell's own line and what it called."""
TAIL_FRAMES = 20
"""Innermost frames kept: where the exception was raised."""
MAX_FRAMES = HEAD_FRAMES + TAIL_FRAMES
MAX_EXCEPTIONS = 64
"""Exceptions (causes, contexts, group members) whose tracebacks are shortened;
a chain longer than this is cut there for the formatting."""
MAX_GROUP_MEMBERS = 15
"""Members of an exception group visited (the standard formatter shows 15)."""
MAX_ENTRY_CHARS = 16 * 1024
MAX_TRACEBACK_CHARS = 96 * 1024
"""The whole formatted traceback; ipykernel sends it twice (error message and
reply), and the gateway trims an error event to 64 KiB anyway."""

_Saved = tuple[BaseException, Any, Any, Any, bool]


def frame_count(tb: TracebackType | None) -> int:
    n = 0
    while tb is not None:
        n += 1
        tb = tb.tb_next
    return n


def shorten(tb: TracebackType | None) -> tuple[TracebackType | None, int]:
    """``tb`` with at most MAX_FRAMES entries (the first HEAD_FRAMES and the last
    TAIL_FRAMES) and how many frames were left out. ``tb`` itself is unchanged."""
    entries: list[TracebackType] = []
    while tb is not None:
        entries.append(tb)
        tb = tb.tb_next
    if len(entries) <= MAX_FRAMES:
        return (entries[0] if entries else None), 0
    kept = entries[:HEAD_FRAMES] + entries[-TAIL_FRAMES:]
    new: TracebackType | None = None
    for entry in reversed(kept):
        new = TracebackType(new, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return new, len(entries) - len(kept)


def _linked(exc: BaseException) -> list[BaseException]:
    out = [e for e in (exc.__cause__, exc.__context__) if e is not None]
    if isinstance(exc, BaseExceptionGroup):
        out.extend(exc.exceptions[:MAX_GROUP_MEMBERS])
    return out


def shorten_exception(value: BaseException) -> tuple[list[_Saved], int]:
    """Shorten the tracebacks of ``value`` and the exceptions linked to it, in
    place, and cut links past MAX_EXCEPTIONS; returns what :func:`restore` needs
    and the number of frames left out."""
    seen: dict[int, BaseException] = {}
    queue: deque[BaseException] = deque([value])
    while queue and len(seen) < MAX_EXCEPTIONS:
        exc = queue.popleft()
        if id(exc) in seen:
            continue
        seen[id(exc)] = exc
        queue.extend(_linked(exc))
    saved: list[_Saved] = []
    omitted = 0
    for exc in seen.values():
        saved.append((exc, exc.__traceback__, exc.__cause__, exc.__context__, exc.__suppress_context__))
        short, cut = shorten(exc.__traceback__)
        omitted += cut
        if cut:
            exc.__traceback__ = short
        suppress = exc.__suppress_context__
        if exc.__cause__ is not None and id(exc.__cause__) not in seen:
            exc.__cause__ = None
        if exc.__context__ is not None and id(exc.__context__) not in seen:
            exc.__context__ = None
        exc.__suppress_context__ = suppress
    return saved, omitted


def restore(saved: list[_Saved]) -> None:
    for exc, tb, cause, context, suppress in saved:
        exc.__traceback__ = tb
        exc.__cause__ = cause
        exc.__context__ = context
        exc.__suppress_context__ = suppress


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    end = limit
    escape = text.rfind("\x1b", max(0, end - 32), end)
    if escape != -1:
        end = escape  # never cut inside a colour code
    return text[:end] + f"\x1b[0m... [{len(text) - end} characters cut]\n"


def cap_text(stb: list[Any], omitted: int = 0) -> list[str]:
    """The formatted traceback (IPython's list of entries) within the size caps,
    with a note when frames or text were left out."""
    entries = [_cut(entry if isinstance(entry, str) else str(entry), MAX_ENTRY_CHARS) for entry in stb]
    if sum(map(len, entries)) > MAX_TRACEBACK_CHARS:
        budget = MAX_TRACEBACK_CHARS // 2
        head: list[str] = []
        used = 0
        for entry in entries[:-1]:
            if used + len(entry) > budget:
                break
            head.append(entry)
            used += len(entry)
        tail: list[str] = [entries[-1]]
        used = len(entries[-1])
        for entry in reversed(entries[len(head) : -1]):
            if used + len(entry) > budget:
                break
            tail.insert(0, entry)
            used += len(entry)
        cut = len(entries) - len(head) - len(tail)
        entries = [*head, f"... [{cut} traceback entries cut: the traceback was too long]", *tail]
    if omitted:
        note = (
            f"[kernelgw: {omitted} frames omitted from this traceback; "
            f"the first {HEAD_FRAMES} and the last {TAIL_FRAMES} of each are shown]"
        )
        entries.insert(min(1, len(entries)), note)
    return entries


class TracebackLimiter:
    """Wraps one shell's ``showtraceback`` and ``_showtraceback`` and, where
    IPython has it (9.x), ``_format_exception_for_storage``: IPython formats a
    failed cell's exception a second time for its history, which cost as much
    as showing it."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell
        self.omitted = 0
        self._show = shell.showtraceback
        self._send = shell._showtraceback
        self._store = getattr(shell, "_format_exception_for_storage", None)

    def install(self) -> None:
        self.shell.showtraceback = self.showtraceback
        self.shell._showtraceback = self.send
        if self._store is not None:
            self.shell._format_exception_for_storage = self.format_for_storage

    def showtraceback(self, exc_tuple: Any = None, *args: Any, **kwargs: Any) -> Any:
        try:
            etype, value, tb = self.shell._get_exc_info(exc_tuple)
        except ValueError:
            return self._show(exc_tuple, *args, **kwargs)
        if not isinstance(value, BaseException):
            return self._show(exc_tuple, *args, **kwargs)
        saved, omitted = shorten_exception(value)
        if tb is saved[0][1]:
            short = value.__traceback__
        else:
            short, cut = shorten(tb)
            omitted += cut
        self.omitted = omitted
        try:
            return self._show((etype, value, short), *args, **kwargs)
        finally:
            self.omitted = 0
            restore(saved)
            if getattr(sys, "last_traceback", None) is short:
                sys.last_traceback = tb  # %debug sees every frame

    def send(self, etype: Any, evalue: Any, stb: Any) -> Any:
        return self._send(etype, evalue, cap_text(list(stb or []), self.omitted))

    def format_for_storage(self, exception: Any, *args: Any, **kwargs: Any) -> Any:
        assert self._store is not None
        if not isinstance(exception, BaseException):
            return self._store(exception, *args, **kwargs)
        saved, omitted = shorten_exception(exception)
        try:
            stored = self._store(exception, *args, **kwargs)
        finally:
            restore(saved)
        if isinstance(stored, dict) and isinstance(stored.get("traceback"), list):
            stored["traceback"] = cap_text(stored["traceback"], omitted)
        return stored


def install_traceback_limits(shell: Any) -> None:
    """Bound ``shell``'s tracebacks (once; a second call changes nothing)."""
    if isinstance(getattr(shell.showtraceback, "__self__", None), TracebackLimiter):
        return
    TracebackLimiter(shell).install()


def sliced(flush_buffers: Callable[[], Any], limit: int = MAX_STREAM_CHARS) -> Callable[[], Any]:
    """An OutStream's ``_flush_buffers`` (which yields ``(parent, text)``, one
    message each) yielding texts of at most ``limit`` characters, in order."""

    def slices() -> Any:
        for parent, data in flush_buffers():
            if len(data) <= limit:
                yield parent, data
                continue
            for start in range(0, len(data), limit):
                yield parent, data[start : start + limit]

    return slices


def slice_streams() -> None:
    """sys.stdout and sys.stderr (ipykernel's OutStreams) send sliced messages."""
    for stream in (sys.stdout, sys.stderr):
        flush_buffers = getattr(stream, "_flush_buffers", None)
        if flush_buffers is not None and not getattr(flush_buffers, "kernelgw_sliced", False):
            replacement = sliced(flush_buffers)
            replacement.kernelgw_sliced = True  # type: ignore[attr-defined]
            stream._flush_buffers = replacement  # type: ignore[union-attr]


def launch_app(after_init: Callable[[Any], None] | None = None, **launch: Any) -> None:
    """ipykernel's kernel app with kernelgw's send HWMs, guarded packer and sliced streams, for
    our Python kernel and for the other languages' kernels of our own
    (``launch`` goes to ``launch_instance``, e.g. their ``kernel_class``)."""
    # as ipykernel_launcher: no imports from the working directory (/workspace)
    if sys.path and (sys.path[0] == "" or Path(sys.path[0]) == Path.cwd()):
        del sys.path[0]

    import zmq
    from ipykernel.kernelapp import IPKernelApp

    from kernelgw_kernel.backpressure import advertising, bound_iopub_socket, bound_outputs

    class KernelApp(IPKernelApp):
        def init_kernel(self) -> None:
            self.kernel_class = advertising(self.kernel_class)  # its output waits: say so
            super().init_kernel()  # type: ignore[no-untyped-call]

        def _bind_socket(self, s: Any, port: int) -> Any:
            # before bind: HWMs apply to the pipes created after they are set
            s.setsockopt(zmq.SNDHWM, SEND_HWM)
            s.setsockopt(zmq.RCVHWM, SEND_HWM)
            bound_iopub_socket(s)  # iopub: blocks past a small HWM instead
            return super()._bind_socket(s, port)  # type: ignore[no-untyped-call]

        def initialize(self, argv: Any = None) -> None:
            super().initialize(argv)  # type: ignore[no-untyped-call]
            self.session.pack = guarded(self.session.pack)
            slice_streams()
            bound_outputs(getattr(self, "iopub_thread", None), (sys.stdout, sys.stderr))
            if after_init is not None:
                after_init(self)

    KernelApp.launch_instance(**launch)


def forget_outputs(shell: Any) -> None:
    """IPython 9 keeps a copy of every cell's output (``history_manager.outputs``:
    each stdout and stderr write, every display with its PNG, every result) for
    the kernel's whole life, for ``%notebook``: a kernel that had printed six
    100 MB lines held 731 MB, and one that went on was killed at its memory
    limit. The gateway keeps the outputs (its history); the kernel does not
    copy its streams, and forgets the rest when each cell ends. ``%notebook``
    then saves cells without their outputs. Once per shell."""
    manager = getattr(shell, "history_manager", None)
    if getattr(shell, "kernelgw_forgets_outputs", False) or not isinstance(getattr(manager, "outputs", None), dict):
        return
    shell.kernelgw_forgets_outputs = True
    if hasattr(shell, "_tee"):  # IPython's per-write copy of stdout and stderr
        shell._tee = _no_copy
    shell.events.register("post_run_cell", lambda *_: shell.history_manager.outputs.clear())


def _no_copy(channel: str) -> contextlib.AbstractContextManager[None]:
    return contextlib.nullcontext()


def _python_shell(app: Any) -> None:
    from kernelgw_kernel import displays
    from kernelgw_kernel.expressions import install_fast_expressions

    install_traceback_limits(app.shell)
    forget_outputs(app.shell)
    install_fast_expressions(app.shell)
    displays.install(app.shell)  # a figure's chart, a DataFrame's data (lazily)


def main() -> None:
    launch_app(_python_shell)


if __name__ == "__main__":
    main()
