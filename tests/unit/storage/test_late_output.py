"""Late output in the store (`Store.execution_late`), on a real SQLite file and a
real PostgreSQL: appended to the ended cell's record after its ``done`` (also
after its output chunks and its row's events), a late error turns the recorded
status to ``error``, the notebook shows it, and the audit log says so; a history
read while a late error commits sees the cell before it or after it, never half.
A cell the next gateway followed (a drain with ``on_shutdown=keep``) has its
later output stored as late output after its interim end, then its real end in
its row: the notebook shows that end and that output as the cell's own."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Coroutine
from typing import Any

from sqlalchemy import event
from sqlalchemy.util import await_only

from kernelgw import events as ev
from kernelgw.runtime.execution_queue import FOLLOW_MISSED
from kernelgw.runtime.fanout import Published
from kernelgw.runtime.session import DETACHED_DONE_REASON
from kernelgw.server.notebook import LATE_NOTE, build_notebook, plan_from_executions
from kernelgw.storage import audit
from kernelgw.storage.store import LATE_AUDIT_KIND, Store
from tests.unit.storage.test_output_chunks import Cell, stand_in_session


class OkCell(Cell):
    async def finish(self) -> None:
        """Ends ``ok`` (as a forged end does)."""
        eid = self.rec.execution_id
        done = ev.Done(execution_id=eid, status="ok", execution_count=1, duration_ms=5.0, seq=self.seq + 1)
        pub = Published(self.seq + 1, done, done.model_dump_json())
        self.sent.append(pub.json)
        await self.store.execution_finished(self.session, self.rec, pub)


class CutCell(Cell):
    async def finish(self) -> None:
        """Ends with the interim end a drain that keeps the kernel stores (`KernelSession.detach`)."""
        eid = self.rec.execution_id
        done = ev.Done(execution_id=eid, status="dead", reason=DETACHED_DONE_REASON, duration_ms=5.0, seq=self.seq + 1)
        pub = Published(self.seq + 1, done, done.model_dump_json())
        self.sent.append(pub.json)
        await self.store.execution_finished(self.session, self.rec, pub)


def late(seq: int, execution_id: str, event: ev.LateOutput) -> Published:
    wrapped = ev.Late(seq=seq, execution_id=execution_id, event=event)
    return Published(seq, wrapped, wrapped.model_dump_json())


async def test_late_output_follows_the_done_and_a_late_error_marks_the_cell(dialect_store: Store) -> None:
    store = dialect_store
    session = stand_in_session()
    await store.session_started(session)
    cell = OkCell(store, session, seq=0)
    for i in range(400):  # over a chunk: the record has chunks and a row of its own
        cell.print(f"line {i} " + "x" * 1000 + "\n")
    await cell.finish()
    eid = cell.rec.execution_id
    seq = cell.seq + 1
    first = [late(seq + 1, eid, ev.Stream(execution_id=eid, name="stdout", text="printed late\n"))]
    await store.execution_late(session, eid, first, 0, False)
    error = ev.Error(
        execution_id=eid, ename="ValueError", evalue="raised late", traceback=["tb"], traceback_text=["tb"]
    )
    second = [late(seq + 2, eid, error)]
    await store.execution_late(session, eid, second, 1, True)
    nxt = Cell(store, session, seq=seq + 2)
    nxt.print("next\n")
    await nxt.finish()

    history = await store.list_executions(session.id)
    record = history[0]
    stored = json.loads(record.events_json)
    assert [e["type"] for e in stored[-4:]] == ["stream", "done", "late", "late"]
    assert stored == [*json.loads(cell.events_json), json.loads(first[0].json), json.loads(second[0].json)]
    assert stored[-3]["status"] == "ok"  # the done as it was sent
    assert record.status == "error" and record.reason is not None and "after this execution had ended" in record.reason
    assert [e.type for e in history[1].events] == ["queued", "stream", "done"]  # the next cell has none of it

    notebook = build_notebook(history)
    outputs = notebook.cells[0].outputs
    assert notebook.cells[0].metadata["kernelgw"]["status"] == "error"
    assert outputs[-1]["output_type"] == "error" and outputs[-1]["evalue"] == "raised late"
    assert outputs[-2]["output_type"] == "stream" and outputs[-2]["text"].endswith("printed late\n")

    rows = await audit.query(store, session_id=session.id, kind=LATE_AUDIT_KIND)
    assert [(r.execution_id, r.status, r.error_name) for r in rows] == [(eid, None, None), (eid, "error", "ValueError")]


async def test_late_output_of_a_cell_never_stored_changes_nothing(dialect_store: Store) -> None:
    store = dialect_store
    session = stand_in_session()
    await store.session_started(session)
    event = ev.Stream(execution_id="gone", name="stdout", text="x")
    await store.execution_late(session, "gone", [late(5, "gone", event)], 0, True)
    assert await store.list_executions(session.id) == []


async def test_late_output_queued_right_behind_its_cells_end_finds_the_record(dialect_store: Store) -> None:
    """A small cell's end may be answered from the journal before its row is
    committed: late output queued right behind it, in the same batch of the
    writer, is still written after that row (not dropped for want of it)."""
    store = dialect_store
    session = stand_in_session()
    await store.session_started(session)
    cell = OkCell(store, session, seq=0)
    cell.print("on time\n")
    eid = cell.rec.execution_id
    error = ev.Error(execution_id=eid, ename="ValueError", evalue="late", traceback=[], traceback_text=[])
    await cell.finish()  # no await of the writer in between
    await store.execution_late(session, eid, [late(cell.seq + 2, eid, error)], 0, True)
    (record,) = await store.list_executions(session.id)
    assert record.status == "error"
    assert [e.type for e in record.events] == ["queued", "stream", "done", "late"]


def commit_between_reads(engine: Any, write: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run ``write`` (a commit) once, right after the next read of the executions
    table on ``engine``, before that read's next statement: where the CI run
    (runsc) met the late error's commit while the history was read."""
    armed = True
    loop = asyncio.get_running_loop()

    def after(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        nonlocal armed
        if not armed or not statement.lstrip().startswith("SELECT") or "FROM kgw_executions" not in statement:
            return
        armed = False
        if threading.current_thread() is threading.main_thread():  # the asyncio engine (PostgreSQL): in a greenlet
            await_only(write())
        else:  # SQLite: the read's statements run in a worker thread
            asyncio.run_coroutine_threadsafe(write(), loop).result(timeout=30)

    event.listen(engine.sync_engine, "after_cursor_execute", after)


async def test_a_history_read_is_one_state_even_when_a_late_error_commits_during_it(dialect_store: Store) -> None:
    """The history reads a cell's row and its chunks in two statements: a late
    error committed between them made the CI read answer the late error (from
    the chunks) with the status from before it (from the row), ``ok``. A read
    sees one state of the database: before the late error (``ok``, no late
    events) or after it (``error``, with them), never half of each."""
    store = dialect_store
    session = stand_in_session()
    await store.session_started(session)
    cell = OkCell(store, session, seq=0)
    cell.print("on time\n")
    eid = cell.rec.execution_id
    await cell.finish()
    error = ev.Error(execution_id=eid, ename="ValueError", evalue="late", traceback=[], traceback_text=[])

    async def late_error() -> None:
        await store.execution_late(session, eid, [late(cell.seq + 2, eid, error)], 0, True)

    commit_between_reads(await store.read_engine(), late_error)
    (record,) = await store.list_executions(session.id)
    types = [e.type for e in record.events]
    assert (record.status, types) in [
        ("ok", ["queued", "stream", "done"]),
        ("error", ["queued", "stream", "done", "late"]),
    ], (record.status, types)
    (record,) = await store.list_executions(session.id)
    assert record.status == "error" and [e.type for e in record.events] == ["queued", "stream", "done", "late"]


async def test_a_followed_cell_s_notebook_shows_how_it_really_ended(dialect_store: Store) -> None:
    """As the follow path stores it (`ExecutionQueue.follow`): the interim end, the
    output the kernel sent after it as late output (a followed cell's error does
    not mark the row), then its real end over the row (`Store.execution_followed`).
    The notebook says what the history says: ``ok`` (or ``error``) with the count,
    that output the cell's own; one that ended while no gateway listened stays
    ``dead`` with that reason. (It showed the interim ``dead``, its reason, and the
    output after a note saying it came after the cell had ended.)"""
    store = dialect_store
    session = stand_in_session()
    await store.session_started(session)
    cells: list[CutCell] = []
    for _ in ("ok", "error", "missed"):  # how each is followed, below
        cell = CutCell(store, session, seq=cells[-1].seq + 3 if cells else 0)
        cell.print("before the stop\n")
        await cell.finish()
        cells.append(cell)
    ok, failed, missed = (c.rec.execution_id for c in cells)
    seq = cells[-1].seq + 3
    await store.execution_late(
        session, ok, [late(seq, ok, ev.Stream(execution_id=ok, name="stdout", text="after the stop\n"))], 0, False
    )
    error = ev.Error(execution_id=failed, ename="ValueError", evalue="later", traceback=["tb"], traceback_text=["tb"])
    await store.execution_late(session, failed, [late(seq + 1, failed, error)], 0, False)
    for eid, done in [
        (ok, ev.Done(execution_id=ok, status="ok", execution_count=7, duration_ms=900.0)),
        (failed, ev.Done(execution_id=failed, status="error", execution_count=8, duration_ms=800.0)),
        (missed, ev.Done(execution_id=missed, status="dead", reason=FOLLOW_MISSED, duration_ms=700.0)),
    ]:
        await store.execution_followed(session, eid, done, DETACHED_DONE_REASON)

    history = await store.list_executions(session.id)
    assert [(r.status, r.execution_count, r.reason) for r in history] == [
        ("ok", 7, None),
        ("error", 8, None),
        ("dead", None, FOLLOW_MISSED),
    ]
    assert [e.type for e in history[0].events] == ["queued", "stream", "done", "late"]  # as the clients were sent

    nb = build_notebook(history)
    shown = [
        (c.execution_count, c.metadata["kernelgw"]["status"], c.metadata["kernelgw"].get("reason")) for c in nb.cells
    ]
    assert shown == [(7, "ok", None), (8, "error", None), (None, "dead", FOLLOW_MISSED)]
    assert [dict(o) for o in nb.cells[0].outputs] == [
        {"output_type": "stream", "name": "stdout", "text": "before the stop\nafter the stop\n"}
    ]
    assert [o["output_type"] for o in nb.cells[1].outputs] == ["stream", "error"]
    assert nb.cells[1].outputs[0]["text"] == "before the stop\n" and nb.cells[1].outputs[1]["evalue"] == "later"
    assert [(o["name"], o["text"]) for o in nb.cells[2].outputs] == [
        ("stdout", "before the stop\n"),
        ("stderr", f"[kernelgw: execution dead: {FOLLOW_MISSED}]\n"),
    ]
    assert not any(LATE_NOTE in str(o.get("text", "")) for c in nb.cells for o in c.outputs)
    assert [s.skip_reason is None for s in plan_from_executions(history)] == [True, True, False]
