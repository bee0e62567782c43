"""Ending background tasks: cancel_and_wait and BackgroundTasks, on real asyncio tasks."""

from __future__ import annotations

import asyncio

import pytest

from kernelgw.tasks import BackgroundTasks, TurnTaker, cancel_and_wait


async def forever(started: asyncio.Event | None = None) -> None:
    if started is not None:
        started.set()
    await asyncio.Event().wait()


async def test_cancels_and_waits_until_the_task_has_ended() -> None:
    cleaned = asyncio.Event()

    async def with_cleanup() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(0)  # clean-up that itself awaits
            cleaned.set()

    task = asyncio.create_task(with_cleanup())
    await asyncio.sleep(0)
    await cancel_and_wait(task)
    assert task.done() and task.cancelled() and cleaned.is_set()


async def test_what_the_task_raised_is_not_the_callers_business() -> None:
    started = asyncio.Event()

    async def fails_when_cancelled() -> None:
        try:
            await forever(started)
        except asyncio.CancelledError:
            raise ValueError("broke while stopping") from None

    task = asyncio.create_task(fails_when_cancelled())
    await started.wait()
    await cancel_and_wait(task)  # does not raise
    assert isinstance(task.exception(), ValueError)


async def test_none_finished_and_several_tasks() -> None:
    done = asyncio.create_task(asyncio.sleep(0))
    await done
    running = [asyncio.create_task(forever()) for _ in range(3)]
    await cancel_and_wait(None, done, *running)
    await cancel_and_wait()
    assert not done.cancelled()
    assert all(t.cancelled() for t in running)


async def test_the_callers_own_cancellation_is_not_swallowed() -> None:
    """The old pattern (``except BaseException: pass`` around ``await task``)
    swallowed a cancellation of the caller that arrived during the wait."""
    release = asyncio.Event()
    stopping = asyncio.Event()

    async def slow_to_stop() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            stopping.set()
            await release.wait()  # a clean-up that takes a while
            raise

    child = asyncio.create_task(slow_to_stop())
    await asyncio.sleep(0)
    after_wait = []

    async def caller() -> None:
        await cancel_and_wait(child)
        after_wait.append("went on as if nothing happened")

    outer = asyncio.create_task(caller())
    await stopping.wait()  # the caller is now waiting for the child
    outer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await outer
    assert outer.cancelled() and after_wait == []
    release.set()
    await asyncio.wait({child})
    assert child.cancelled()


async def test_a_caller_cleaning_up_after_its_own_cancellation_still_waits() -> None:
    """A task that was cancelled and stops its children in ``finally`` gets to
    finish that clean-up (no new cancellation is pending)."""
    stopped = []

    async def owner() -> None:
        child = asyncio.create_task(forever())
        try:
            await asyncio.Event().wait()
        finally:
            await cancel_and_wait(child)
            stopped.append(child.cancelled())

    task = asyncio.create_task(owner())
    await asyncio.sleep(0)
    await cancel_and_wait(task)
    assert stopped == [True]


async def test_background_tasks_are_referenced_until_they_end() -> None:
    background = BackgroundTasks("test")
    gate = asyncio.Event()
    results = []

    async def work(n: int) -> None:
        await gate.wait()
        results.append(n)

    for n in range(3):
        background.spawn(work(n))
    assert len(background) == 3
    gate.set()
    await background.join()
    assert sorted(results) == [0, 1, 2]
    await asyncio.sleep(0)  # done callbacks run on the next loop iteration
    assert len(background) == 0


async def test_background_tasks_cancel_ends_all_and_failures_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    background = BackgroundTasks("test")

    async def fails() -> None:
        raise RuntimeError("boom")

    failing = background.spawn(fails(), name="failing")
    waiting = background.spawn(forever(), name="waiting")
    await asyncio.wait({failing})
    await background.cancel()
    assert waiting.cancelled()
    await asyncio.sleep(0)
    assert len(background) == 0
    assert any("failing" in r.getMessage() and r.exc_info for r in caplog.records)


async def test_a_turn_taker_lets_other_tasks_run_every_few_steps() -> None:
    """Awaits that do not suspend (a queue that holds items) would run the whole
    loop before anything else; with a TurnTaker other tasks run in between."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(100):
        queue.put_nowait(i)
    seen_by_other: list[int] = []
    taken: list[int] = []

    async def drain(turns: TurnTaker | None) -> None:
        while not queue.empty():
            taken.append(await queue.get())
            if turns is not None:
                await turns.step()

    async def other() -> None:
        while len(taken) < 100:
            seen_by_other.append(len(taken))
            await asyncio.sleep(0)

    watcher = asyncio.create_task(other())
    await asyncio.sleep(0)
    await drain(TurnTaker(every=10))
    await watcher
    assert seen_by_other[1:4] == [10, 20, 30]
