"""The iopub reader waits for the store (`kernelgw.runtime.output_backlog`).

A real kernel floods (24 MiB in 256 KiB prints) into a real store (SQLite and
PostgreSQL) whose writer is slowed: the gateway never holds much more than
`BACKLOG_BYTES` of the cell's output handed to the store and uncommitted, the
reader does wait, the cell ends ``ok`` (its idle is not taken for lost while
the reader waits) with every byte stored and delivered in order, and another
session's ``1+1`` ends while the flood still runs. A writer that stalls, an
interrupt and a timeout never leave a cell waiting behind the store.
"""

from __future__ import annotations

import asyncio
import gc
import json
import threading
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import zmq

from kernelgw.runtime import execution_queue
from kernelgw.runtime.fanout import Published
from kernelgw.runtime.kernel_connection import IOPUB_RECEIVE_HWM
from kernelgw.runtime.output_backlog import BACKLOG_BYTES, OutputBacklog
from kernelgw.runtime.session import KernelSession
from kernelgw.storage.store import Store
from tests.unit.runtime.conftest import SessionFactory
from tests.unit.runtime.test_session import done_of, run, until

MIB = 1 << 20
LINE = 256 * 1024
"""One print: the Python kernel's largest stream message (its slices), so every
print is one message and one output chunk."""
FLOOD_MIB = 24
FLOOD = f"for _ in range({FLOOD_MIB * MIB // LINE}):\n    print('y' * {LINE - 1}, flush=True)"
ENDLESS = f"import time\nwhile True:\n    print('y' * {LINE - 1}, flush=True)\n    time.sleep(0.01)"
"""About 25 MB/s, for as long as it is let."""
CHUNK_DELAY_S = 0.025
"""How long each output chunk's write waits: the store writes about 10 MB/s."""


@pytest.fixture
def store(dialect_store: Store) -> Store:
    """Each test runs on SQLite and on PostgreSQL (tests/unit/conftest.py)."""
    return dialect_store


class SlowChunks:
    """Every output chunk the store writes first waits ``delay_s``, and while the
    gate is shut, until it opens (a stalled writer). SQLite's writes run in the
    writer's thread, where only blocking waits are allowed (and hold only the
    writer); PostgreSQL's run on the event loop and await."""

    def __init__(self, store: Store, monkeypatch: pytest.MonkeyPatch, delay_s: float, *, shut: bool = False) -> None:
        self.delay_s = delay_s
        self.written = 0
        self._thread_gate = threading.Event()
        self._loop_gate = asyncio.Event()
        if not shut:
            self.open()
        enqueue = store.enqueue

        def slowed_enqueue(what: str, write: Any, future: Any = None, **kwargs: Any) -> None:
            enqueue(what, self._slowed(write) if what.startswith("output chunk") else write, future, **kwargs)

        monkeypatch.setattr(store, "enqueue", slowed_enqueue)

    def open(self) -> None:
        self._thread_gate.set()
        self._loop_gate.set()

    def _slowed(self, write: Callable[[Any], Awaitable[Any]]) -> Callable[[Any], Awaitable[Any]]:
        async def slowed(conn: Any) -> Any:
            if threading.current_thread() is threading.main_thread():
                await asyncio.sleep(self.delay_s)
                await self._loop_gate.wait()
            else:
                # the SQLite writer's thread, not the event loop: a write there cannot await
                time.sleep(self.delay_s)  # noqa: ASYNC251
                self._thread_gate.wait(60)
            self.written += 1
            return await write(conn)

        return slowed


async def recording(new_session: SessionFactory, store: Store, **config: Any) -> KernelSession:
    session = await new_session(**config)
    session.recorder = store
    await store.session_started(session)
    return session


def backlog_of(session: KernelSession) -> OutputBacklog:
    return session._executions.backlog


def track_events(session: KernelSession, monkeypatch: pytest.MonkeyPatch) -> Callable[[], int]:
    """How many of the session's published events are still alive (weak references)."""
    fanout = session._executions._fanout
    publish = fanout.publish
    refs: list[weakref.ref[Published]] = []

    def tracked(event: Any, prepared: Published | None = None) -> Published:
        pub = publish(event, prepared)
        refs.append(weakref.ref(pub))
        return pub

    monkeypatch.setattr(fanout, "publish", tracked)
    return lambda: sum(1 for ref in refs if ref() is not None)


async def eventually(check: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    """Poll ``check`` (the state it reads sets no event) until it holds."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout:g}s: {what}"
        await asyncio.sleep(0.005)


def stream_text(events: list[dict[str, Any]]) -> str:
    return "".join(e["text"] for e in events if e["type"] == "stream")


async def test_a_flood_waits_for_a_slow_store_and_ends_ok_with_everything_in_order(
    new_session: SessionFactory, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    flooding = await recording(new_session, store, max_output_bytes=64 * MIB)
    bystander = await recording(new_session, store)
    slow = SlowChunks(store, monkeypatch, CHUNK_DELAY_S)
    backlog = backlog_of(flooding)
    alive = track_events(flooding, monkeypatch)
    sub = flooding.subscribe(flooding.last_seq)
    started = time.perf_counter()
    rec = flooding.submit(FLOOD)
    reading = asyncio.create_task(until(sub, done_of(rec.execution_id)))
    await eventually(lambda: backlog.waits > 0, "the reader waits for the store")
    # the other session is not held up by the flood's wait
    t0 = time.perf_counter()
    other = await run(bystander, "1+1")
    other_ms = (time.perf_counter() - t0) * 1000
    assert other[-1]["status"] == "ok" and any(e.get("data", {}).get("text/plain") == "2" for e in other)
    assert not rec.done.done(), "the flood ended before the other session's cell: nothing was shown"
    # late in the flood, the events of the chunks committed are gone from memory
    # (the writer's rows let go once written), not only from the cell's list
    lines = FLOOD_MIB * MIB // LINE
    await eventually(lambda: slow.written >= lines * 3 // 4 or rec.done.done(), "most chunks are written")
    gc.collect()
    held = alive()
    print(f"{slow.written} of {lines} chunks written: {held} of the cell's events still in memory")
    assert not rec.done.done() and held * LINE <= 3 * BACKLOG_BYTES
    events = [e for e in await reading if e["execution_id"] == rec.execution_id]
    elapsed = time.perf_counter() - started
    print(
        f"{FLOOD_MIB} MiB through a store at {CHUNK_DELAY_S * 1000:.0f} ms a chunk: {elapsed:.2f} s, "
        f"{backlog.waits} waits, at most {backlog.peak / MIB:.2f} MiB uncommitted (bound "
        f"{BACKLOG_BYTES / MIB:.0f} MiB), {slow.written} chunks written; the other session's 1+1: {other_ms:.0f} ms"
    )
    done = events[-1]
    assert done["type"] == "done" and done["status"] == "ok"
    assert done["reason"] is None, done["reason"]  # in particular, its idle was not taken for lost
    assert backlog.unbounded is None
    # never much more than the bound: what one read adds past it (a message of 256 KiB)
    assert BACKLOG_BYTES < backlog.peak <= BACKLOG_BYTES + MIB
    assert stream_text(events) == ("y" * (LINE - 1) + "\n") * (FLOOD_MIB * MIB // LINE)
    [row] = [h for h in await store.list_executions(flooding.id) if h.execution_id == rec.execution_id]
    assert json.loads(row.events_json) == events
    assert slow.written >= FLOOD_MIB * MIB // LINE - 2
    # what the reader left unread waited in the kernel: our receive queue is short
    assert flooding._link._kc is not None
    assert flooding._link._kc.iopub_channel.socket.getsockopt(zmq.RCVHWM) == IOPUB_RECEIVE_HWM


async def test_a_stalled_store_does_not_hold_the_cell(
    new_session: SessionFactory, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = await recording(new_session, store, max_output_bytes=64 * MIB)
    stalled = SlowChunks(store, monkeypatch, 0.0, shut=True)
    backlog = backlog_of(session)
    # the store stalls longer than a quiet iopub takes to look like a lost idle:
    # a reader held back by the store is unread output, not quiet
    monkeypatch.setattr(execution_queue, "IOPUB_QUIET_S", 1.0)
    backlog.stall_s = 1.5
    sub = session.subscribe(session.last_seq)
    rec = session.submit(FLOOD)
    try:
        # the reader waits, gives up on the store, and reads the cell to its end
        await eventually(lambda: rec.finished.is_set(), "the kernel's reply and idle are read")
        assert backlog.waits >= 1 and backlog.unbounded is not None and "committed nothing" in backlog.unbounded
        assert stalled.written == 0
    finally:
        stalled.open()
    events = [e for e in await until(sub, done_of(rec.execution_id)) if e["execution_id"] == rec.execution_id]
    assert events[-1]["status"] == "ok" and events[-1]["reason"] is None, events[-1]
    assert stream_text(events) == ("y" * (LINE - 1) + "\n") * (FLOOD_MIB * MIB // LINE)
    [row] = [h for h in await store.list_executions(session.id) if h.execution_id == rec.execution_id]
    assert json.loads(row.events_json) == events


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_a_subscriber_that_stops_reading_holds_up_neither_the_cell_nor_the_store(
    new_session: SessionFactory, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reader waits for the store only: a WebSocket client that reads nothing
    is dropped past its queue's bound, as before, and the cell goes on."""
    session = await recording(new_session, store, max_output_bytes=64 * MIB, subscriber_max_bytes=4 * MIB)
    SlowChunks(store, monkeypatch, CHUNK_DELAY_S)
    stuck = session.subscribe(session.last_seq)  # never read while the cell runs
    reading = session.subscribe(session.last_seq)
    rec = session.submit(FLOOD)
    events = [e for e in await until(reading, done_of(rec.execution_id)) if e["execution_id"] == rec.execution_id]
    assert events[-1]["status"] == "ok" and events[-1]["reason"] is None, events[-1]
    assert stream_text(events) == ("y" * (LINE - 1) + "\n") * (FLOOD_MIB * MIB // LINE)
    assert stuck.overflowed and stuck.queued_bytes <= 4 * MIB
    assert backlog_of(session).waits > 0


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_an_interrupt_reaches_a_cell_whose_reader_waits(
    new_session: SessionFactory, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = await recording(new_session, store, max_output_bytes=4 * MIB)
    SlowChunks(store, monkeypatch, 0.1)
    backlog = backlog_of(session)
    backlog.limit = MIB  # under the cap: the reader waits before the output is cut
    sub = session.subscribe(session.last_seq)
    rec = session.submit(ENDLESS)
    await eventually(lambda: backlog.waiting, "the reader waits for the store")
    assert await session.interrupt()
    events = [e for e in await until(sub, done_of(rec.execution_id)) if e["execution_id"] == rec.execution_id]
    assert events[-1]["status"] == "interrupted", events[-1]
    assert backlog.unbounded == "interrupted"
    # the kernel is fine and keeps its state
    assert (await run(session, "print('after')"))[-1]["status"] == "ok"


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_a_timeout_reaches_a_cell_whose_reader_waits(
    new_session: SessionFactory, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = await recording(new_session, store, max_output_bytes=4 * MIB)
    SlowChunks(store, monkeypatch, 0.1)
    backlog = backlog_of(session)
    backlog.limit = MIB  # under the cap: the reader waits before the output is cut
    await run(session, "kept = 41")
    sub = session.subscribe(session.last_seq)
    rec = session.submit(ENDLESS, timeout=1.5)
    events = [e for e in await until(sub, done_of(rec.execution_id)) if e["execution_id"] == rec.execution_id]
    done = events[-1]
    assert done["status"] == "timeout" and "variables defined before are kept" in done["reason"], done
    assert backlog.waits >= 1 and backlog.unbounded == "timed out"
    assert (await run(session, "kept + 1"))[-2]["data"]["text/plain"] == "42"


# ------------------------------------------------------------- the count alone


def published(*sizes: int) -> list[Any]:
    return [Published(i, None, "x" * size) for i, size in enumerate(sizes)]


async def test_the_backlog_counts_chunks_until_committed_and_ignores_other_cells() -> None:
    backlog = OutputBacklog(limit=100)
    backlog.begin("a")
    backlog.taken("a", 1, published(60, 30))
    backlog.taken("other", 3, published(500))  # an earlier cell's late chunk
    assert backlog.uncommitted == 90 and not backlog.over
    backlog.taken("a", 3, published(40))
    assert backlog.over and backlog.peak == 130
    backlog.committed("other", 3)
    assert backlog.over
    backlog.committed("a", 1)
    assert backlog.uncommitted == 40 and not backlog.over and backlog.peak == 130


async def settle() -> None:
    """Let the waiting task run until it blocks again (a few turns of the loop,
    no wall-clock time: nothing here waits on I/O)."""
    for _ in range(5):
        await asyncio.sleep(0)


async def test_the_reader_waits_until_a_commit_brings_the_backlog_under_its_bound() -> None:
    backlog = OutputBacklog(limit=100)
    backlog.begin("a")
    backlog.taken("a", 1, published(150))
    backlog.taken("a", 2, published(50))
    waiting = asyncio.create_task(backlog.room())
    await settle()
    assert not waiting.done() and backlog.waiting
    backlog.committed("a", 2)  # 150 left: still over
    await settle()
    assert not waiting.done()
    backlog.committed("a", 1)
    await asyncio.wait_for(waiting, 1)
    assert not backlog.waiting and backlog.waits == 1


@pytest.mark.parametrize("how", ["end", "unbound", "stall"])
async def test_the_wait_ends_with_the_cell_an_interrupt_or_a_stalled_store(how: str) -> None:
    backlog = OutputBacklog(limit=10, stall_s=0.2)
    backlog.begin("a")
    backlog.taken("a", 1, published(50))
    waiting = asyncio.create_task(backlog.room())
    await settle()
    assert not waiting.done() and backlog.waiting
    if how == "end":
        backlog.end()
    elif how == "unbound":
        backlog.unbound("interrupted")
    await asyncio.wait_for(waiting, 2)
    assert not backlog.over
    if how == "stall":
        assert backlog.unbounded is not None and "committed nothing for 0.2s" in backlog.unbounded
    # a new cell is bounded again
    backlog.begin("b")
    backlog.taken("b", 1, published(50))
    assert backlog.over and backlog.unbounded is None
