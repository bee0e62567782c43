"""Recovery by replay: which cells built the kernel's state, and a replay's report.

The *lineage* of a kernel is the cells that ran in it successfully, in order,
except those marked not to replay (``replay: false``: side effects such as
sending mail). Cells replayed into a kernel join its lineage like any other.
A replay runs a lineage again in a fresh kernel; a plain restart starts an
empty one. Pure: the execution queue keeps one `Lineage` per session, the
store rebuilds it for a reattached session from the ``kernel_id`` of each
stored execution.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from kernelgw.events import ReplayTrigger

ReplayStatus = Literal["ok", "error", "timeout", "interrupted", "dead", "skipped"]


@dataclass(frozen=True)
class LineageCell:
    execution_id: str
    code: str
    timeout: float | None = None
    """The timeout it ran with (None: not known, for cells read back from the store)."""


class Lineage:
    """The cells that made the state of one kernel (``kernel_id``), oldest first."""

    def __init__(self, kernel_id: str | None = None, cells: Iterable[LineageCell] = ()) -> None:
        self.kernel_id = kernel_id
        self._cells = list(cells)

    @property
    def cells(self) -> tuple[LineageCell, ...]:
        return tuple(self._cells)

    def __len__(self) -> int:
        return len(self._cells)

    def note(self, cell: LineageCell, *, kernel_id: str | None, status: str, replayable: bool) -> bool:
        """Add a cell that ended; only one that ran ``ok`` in this kernel and may
        be replayed joins. Returns whether it joined."""
        if status != "ok" or not replayable or kernel_id is None or kernel_id != self.kernel_id:
            return False
        self._cells.append(cell)
        return True

    def new_kernel(self, kernel_id: str | None) -> tuple[LineageCell, ...]:
        """A fresh kernel replaced this one: start its (empty) lineage and return
        the old one's cells (what a replay runs)."""
        old = self.cells
        self.kernel_id = kernel_id
        self._cells = []
        return old


def lineage_of(executions: Iterable[Any], kernel_id: str) -> list[LineageCell]:
    """The lineage of ``kernel_id`` from stored executions (objects with
    ``position``, ``execution_id``, ``code``, ``status``, ``kernel_id`` and
    ``replayable``), for a session a restarted gateway reattached."""
    ordered = sorted(executions, key=lambda e: e.position)
    return [
        LineageCell(e.execution_id, e.code)
        for e in ordered
        if e.kernel_id == kernel_id and e.status == "ok" and e.replayable
    ]


@dataclass(frozen=True)
class ReplayedCellOutcome:
    """What happened to one cell of a replay."""

    index: int
    """Its place in the replay (0 = the oldest cell of the lineage)."""
    replay_of: str
    """The execution it re-ran."""
    status: ReplayStatus
    execution_id: str | None = None
    """The replayed execution (None when skipped)."""
    duration_ms: float | None = None
    ename: str | None = None
    evalue: str | None = None
    reason: str | None = None


@dataclass(frozen=True)
class ReplayReport:
    trigger: ReplayTrigger
    cells: Sequence[ReplayedCellOutcome]
    duration_ms: float

    @property
    def replayed(self) -> int:
        """Cells that ran ``ok``."""
        return sum(1 for c in self.cells if c.status == "ok")

    @property
    def complete(self) -> bool:
        """Every cell ran ``ok``: the kernel's state is rebuilt."""
        return all(c.status == "ok" for c in self.cells)

    @property
    def stopped_at(self) -> int | None:
        """The index of the cell that failed and stopped the replay."""
        return next((c.index for c in self.cells if c.status not in ("ok", "skipped")), None)


@dataclass
class ReplayJob:
    """A replay waiting for (or held by) the execution queue's worker."""

    cells: Sequence[LineageCell]
    trigger: ReplayTrigger
    report: asyncio.Future[ReplayReport] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    started: float = field(default_factory=time.monotonic)
