"""KernelSession's state machine on a real kernel process, without an engine:
the queue, interrupts, the timeout escalation, death, restart, fan-out and
replay, the output cap, and closing with work queued.

Tests wait on what the session says (events, ``done``), never on sleeps.
"""

from __future__ import annotations

import asyncio
import gc
import json
import weakref
from typing import Any

import pytest

from kernelgw.errors import BadRequest
from kernelgw.runtime.kernel_messages import MAX_BATCH
from kernelgw.runtime.session import KernelSession, Subscription
from tests.support.local_backend import LocalBackend
from tests.unit.runtime.conftest import SessionFactory

WAIT_S = 30
"""A deadline for anything a test waits for; reached only when something is broken."""


async def next_event(sub: Subscription) -> dict[str, Any]:
    async with asyncio.timeout(WAIT_S):
        text = await sub.get()
    assert text is not None, "the subscription ended"
    return json.loads(text)  # type: ignore[no-any-return]


async def until(sub: Subscription, predicate: Any) -> list[dict[str, Any]]:
    """Events from ``sub`` up to and including the first that matches."""
    events = []
    while True:
        event = await next_event(sub)
        events.append(event)
        if predicate(event):
            return events


def done_of(execution_id: str) -> Any:
    return lambda e: e["type"] == "done" and e["execution_id"] == execution_id


async def run(session: KernelSession, code: str, **kwargs: Any) -> list[dict[str, Any]]:
    """Submit ``code`` and return its events, ``done`` last."""
    sub = session.subscribe(session.last_seq)
    try:
        rec = session.submit(code, **kwargs)
        return [e for e in await until(sub, done_of(rec.execution_id)) if e["execution_id"] == rec.execution_id]
    finally:
        session.unsubscribe(sub)


def stdout(events: list[dict[str, Any]]) -> str:
    return "".join(e["text"] for e in events if e["type"] == "stream" and e["name"] == "stdout")


def result_text(events: list[dict[str, Any]]) -> str:
    return str(next(e for e in events if e["type"] == "result")["data"]["text/plain"])


async def test_start_runs_a_cell_and_reports_its_artifacts(new_session: SessionFactory) -> None:
    session = await new_session()
    assert session.state == "idle" and session.kernel_info["status"] == "ok"
    events = await run(session, "open('out.txt', 'w').write('hello')\nprint(6 * 7)")
    assert [e["type"] for e in events] == ["queued", "status", "stream", "done"]
    done = events[-1]
    assert done["status"] == "ok" and done["execution_count"] == 1
    assert stdout(events) == "42\n"
    assert done["artifacts"] == [{"path": "out.txt", "size": 5, "mime_type": "text/plain", "change": "created"}]
    seqs = [e["seq"] for e in events]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    info = session.info()
    assert info["state"] == "idle" and info["execution_count"] == 1 and info["last_seq"] == seqs[-1]


async def test_queued_cells_run_one_at_a_time_in_submission_order(new_session: SessionFactory) -> None:
    session = await new_session()
    await run(session, "order = []")
    sub = session.subscribe(session.last_seq)
    recs = [session.submit(f"import time\ntime.sleep(0.05)\norder.append({i})") for i in range(4)]
    assert session.queue_length == 4
    events = await until(sub, done_of(recs[-1].execution_id))
    queued = [e for e in events if e["type"] == "queued"]
    assert [e["position"] for e in queued] == [0, 1, 2, 3]
    dones = [e for e in events if e["type"] == "done"]
    assert [d["execution_id"] for d in dones] == [r.execution_id for r in recs]
    assert [d["execution_count"] for d in dones] == [2, 3, 4, 5]
    # one at a time: each cell's busy comes after the previous cell's done
    order = [(e["type"], e["execution_id"]) for e in events if e["type"] in ("status", "done")]
    assert order == [(kind, r.execution_id) for r in recs for kind in ("status", "done")]
    assert result_text(await run(session, "order")) == "[0, 1, 2, 3]"
    assert session.queue_length == 0


async def test_interrupt_stops_the_running_cell_and_keeps_variables(new_session: SessionFactory) -> None:
    session = await new_session()
    await run(session, "keep = 5")
    assert await session.interrupt() is False  # nothing runs
    sub = session.subscribe(session.last_seq)
    rec = session.submit("import time\nprint('sleeping', flush=True)\ntime.sleep(60)")
    await until(sub, lambda e: e["type"] == "stream")  # the cell is inside the sleep
    assert session.state == "busy"
    assert await session.interrupt() is True
    events = await until(sub, done_of(rec.execution_id))
    assert events[-1]["status"] == "interrupted" and events[-1]["state_lost"] is False
    assert any(e["type"] == "error" and e["ename"] == "KeyboardInterrupt" for e in events)
    assert stdout(await run(session, "print(keep)")) == "5\n"


async def test_timeout_interrupts_and_keeps_variables(new_session: SessionFactory) -> None:
    session = await new_session()
    await run(session, "kept = 'still here'")
    events = await run(session, "while True:\n    pass", timeout=0.5)
    done = events[-1]
    assert done["status"] == "timeout" and done["state_lost"] is False
    assert "interrupted" in done["reason"]
    assert any(e["type"] == "error" and e["ename"] == "KeyboardInterrupt" for e in events)
    assert session.state == "idle"
    assert stdout(await run(session, "print(kept)")) == "still here\n"


async def test_timeout_whose_interrupt_is_ignored_restarts_the_kernel(
    new_session: SessionFactory, local_backend: LocalBackend
) -> None:
    session = await new_session(interrupt_grace_s=0.5)
    await run(session, "lost = 1")
    old_kernel = session.handle
    swallow = (
        "while True:\n    try:\n        while True:\n            pass\n    except KeyboardInterrupt:\n        pass\n"
    )
    done = (await run(session, swallow, timeout=0.5))[-1]
    assert done["status"] == "timeout" and done["state_lost"] is True
    assert "restarted" in done["reason"] and "lost" in done["reason"]
    assert session.state == "idle" and session.execution_count == 0
    assert session.handle is not None and old_kernel is not None
    assert session.handle.kernel_id != old_kernel.kernel_id and local_backend.started == 2
    assert old_kernel.kernel_id not in local_backend.kernels  # the old process was stopped
    assert result_text(await run(session, "'lost' in dir()")) == "False"


async def test_killed_kernel_is_dead_with_its_signal_until_restarted(
    new_session: SessionFactory, local_backend: LocalBackend
) -> None:
    session = await new_session()
    sub = session.subscribe(session.last_seq)
    rec = session.submit("import time\nprint('before the crash', flush=True)\ntime.sleep(60)")
    events = await until(sub, lambda e: e["type"] == "stream")
    assert session.handle is not None
    local_backend.kill_kernel(session.handle)  # kill -9 from outside, as an OOM killer would
    events += await until(sub, done_of(rec.execution_id))
    done = events[-1]
    assert stdout([e for e in events if e["execution_id"] == rec.execution_id]) == "before the crash\n"
    assert done["status"] == "dead" and done["state_lost"] is True
    assert "signal 9" in done["reason"] and "restart" in done["reason"]
    assert session.state == "dead" and "signal 9" in (session.dead_reason or "")
    # a dead session refuses work with the same reason, without hanging
    later = (await run(session, "1"))[-1]
    assert later["status"] == "dead" and "signal 9" in later["reason"]
    await session.restart()
    assert session.state == "idle" and session.dead_reason is None and session.execution_count == 0
    assert stdout(await run(session, "print('back')")) == "back\n"


async def test_kernel_exit_is_reported_with_its_code(new_session: SessionFactory) -> None:
    session = await new_session()
    done = (await run(session, "import os\nos._exit(3)"))[-1]
    assert done["status"] == "dead" and "exited with code 3" in done["reason"]
    assert session.state == "dead"


async def test_restart_while_a_cell_runs_ends_it_as_dead_with_state_lost(new_session: SessionFactory) -> None:
    session = await new_session()
    await run(session, "gone = 1")
    sub = session.subscribe(session.last_seq)
    rec = session.submit("import time\nprint('started', flush=True)\ntime.sleep(60)")
    await until(sub, lambda e: e["type"] == "stream")
    await session.restart()
    done = (await until(sub, done_of(rec.execution_id)))[-1]
    assert done["status"] == "dead" and done["state_lost"] is True and "restarted" in done["reason"]
    assert result_text(await run(session, "'gone' in dir()")) == "False"


async def test_every_subscriber_gets_the_same_events_and_replay_resumes_after_last_seq(
    new_session: SessionFactory,
) -> None:
    session = await new_session()
    start = session.last_seq
    a, b = session.subscribe(), session.subscribe()
    assert session.subscriber_count == 2
    rec = session.submit("for i in range(3):\n    print(i, flush=True)")
    seen_a = await until(a, done_of(rec.execution_id))
    seen_b = await until(b, done_of(rec.execution_id))
    assert seen_a == seen_b
    assert [e["seq"] for e in seen_a] == list(range(start + 1, session.last_seq + 1))
    # a client that saw up to the second event resumes with exactly the rest
    resumed = session.subscribe(last_seq=seen_a[1]["seq"])
    assert await until(resumed, done_of(rec.execution_id)) == seen_a[2:]
    for sub in (a, b, resumed):
        session.unsubscribe(sub)
    assert session.subscriber_count == 0


async def test_replay_older_than_the_buffer_starts_with_a_gap(new_session: SessionFactory) -> None:
    session = await new_session(replay_buffer=3)
    rec = session.submit("for i in range(5):\n    print(i, flush=True)")
    await rec.done
    sub = session.subscribe(last_seq=0)
    gap = await next_event(sub)
    assert gap["type"] == "gap" and gap["first_missing"] == 1
    kept = [await next_event(sub) for _ in range(3)]
    assert gap["last_missing"] == kept[0]["seq"] - 1
    assert [e["seq"] for e in kept] == list(range(session.last_seq - 2, session.last_seq + 1))
    assert kept[-1]["type"] == "done"


async def test_a_subscriber_that_falls_behind_is_dropped_without_slowing_the_others(
    new_session: SessionFactory,
) -> None:
    # the link hands over up to MAX_BATCH messages at once: a queue that holds a
    # batch keeps a reader that reads as they come, and 3000 prints overflow it
    session = await new_session(subscriber_queue=MAX_BATCH + 44)
    slow, fast = session.subscribe(), session.subscribe()
    rec = session.submit("for i in range(3000):\n    print(i, flush=True)")
    events = await until(fast, done_of(rec.execution_id))  # read as they come
    assert events[-1]["status"] == "ok"
    assert slow.overflowed and await slow.get() is None
    assert session.subscriber_count == 1


async def test_output_over_the_cap_is_cut_with_one_truncation_marker(new_session: SessionFactory) -> None:
    session = await new_session(max_output_bytes=2000)
    events = await run(session, "for i in range(100):\n    print('x' * 99, flush=True)\nprint('end')")
    assert events[-1]["status"] == "ok"  # the code kept running
    marks = [e for e in events if e["type"] == "truncated"]
    assert len(marks) == 1 and marks[0]["limit_bytes"] == 2000
    assert len(stdout(events)) <= 2000 and "end" not in stdout(events)
    # the next execution has its own budget
    assert stdout(await run(session, "print('fresh')")) == "fresh\n"


async def test_close_ends_running_and_queued_work_and_subscriptions(
    new_session: SessionFactory, local_backend: LocalBackend
) -> None:
    session = await new_session()
    sub = session.subscribe(session.last_seq)
    running = session.submit("import time\nprint('in', flush=True)\ntime.sleep(60)")
    waiting = session.submit("print('never')")
    await until(sub, lambda e: e["type"] == "stream")
    await session.close()
    assert session.state == "closed" and local_backend.running() == []
    first, second = await running.done, await waiting.done
    assert first.status == "dead" and first.state_lost and first.reason == "the session was deleted"
    assert second.status == "dead" and "before this execution ran" in (second.reason or "")
    texts = []
    while (text := await sub.get()) is not None:
        texts.append(json.loads(text))
    assert [e["execution_id"] for e in texts if e["type"] == "done"] == [running.execution_id, waiting.execution_id]
    with pytest.raises(BadRequest):
        session.submit("1")
    await session.close()  # idempotent


async def test_submit_validates_timeout_and_execution_id(new_session: SessionFactory) -> None:
    session = await new_session(exec_timeout_s=5, max_exec_timeout_s=10)
    with pytest.raises(BadRequest, match="timeout"):
        session.submit("1", timeout=11)
    with pytest.raises(BadRequest, match="timeout"):
        session.submit("1", timeout=0)
    rec = session.submit("1", execution_id="once")
    with pytest.raises(BadRequest, match="already used"):
        session.submit("2", execution_id="once")
    assert (await rec.done).status == "ok"


async def test_an_ended_cell_and_its_output_are_not_kept_by_the_session(new_session: SessionFactory) -> None:
    """The link remembers ended cells to report the kernel's late messages for
    them; it must not keep their output (up to the cap, per remembered cell)."""
    session = await new_session()
    rec = session.submit("print('x' * 1_000_000)")
    assert (await rec.done).status == "ok"
    assert (await run(session, "1+1"))[-1]["status"] == "ok"  # the queue has moved on
    ended = weakref.ref(rec)
    del rec
    gc.collect()
    assert ended() is None, gc.get_referrers(ended())
