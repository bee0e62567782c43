"""A kernel of ours whose language process ended under a cell (``exit``,
``exec``, a kill, out of memory) ends itself the same way, after its output is
out: the container ends with the language's status, and the gateway ends the
cell ``dead`` with the real cause (the engine's out-of-memory report, the exit
code, the signal) and ``state_lost``, as it does for Python's kernel. Starting a
new language process in the same kernel instead ended the cell ``ok`` or
``error`` with ``state_lost=false`` while the state was gone."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import Any, NoReturn


def fence(iopub_thread: Any, timeout: float = 2.0) -> None:
    """Wait until ipykernel's iopub thread has sent what was queued before."""
    if iopub_thread is None:
        return
    sent = threading.Event()
    iopub_thread.schedule(sent.set)
    sent.wait(timeout)


def end_as(code: int | None, sig: int | None) -> NoReturn:
    """End this process as the language process ended: by its signal, or with its exit code."""
    if sig:
        with contextlib.suppress(OSError, ValueError):
            signal.signal(sig, signal.SIG_DFL)
            os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(code or 0)
