"""The gateway gives freed memory back once a burst of kernel output is over."""

from __future__ import annotations

import asyncio
import sys

import pytest

from kernelgw.runtime import allocator
from kernelgw.runtime.allocator import CALM_BYTES, TRIM_AFTER_BYTES, AllocatorTrimmer


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_glibcs_malloc_trim_is_found_and_runs() -> None:
    trim = allocator._load_malloc_trim()
    assert trim is not None
    assert trim(0) in (0, 1)


async def test_one_trim_after_a_burst_once_it_is_over_and_none_for_little_output() -> None:
    calls: list[int] = []
    trimmer = AllocatorTrimmer(trim=calls.append)  # type: ignore[arg-type]
    allocator.note_received(TRIM_AFTER_BYTES // 2)
    assert not await trimmer.check() and not await trimmer.check(), "not enough to be worth a trim"
    for _ in range(3):  # a burst: more than CALM_BYTES between polls
        allocator.note_received(TRIM_AFTER_BYTES)
        assert not await trimmer.check(), "not while the output still flows"
    allocator.note_received(CALM_BYTES - 1)
    assert await trimmer.check()
    assert calls == [0] and trimmer.trims == 1
    settle = [await trimmer.check() for _ in range(allocator.SETTLE_POLLS + 3)]
    assert settle.count(True) == 1 and settle[allocator.SETTLE_POLLS - 1], "once more, a few polls later"
    assert calls == [0, 0] and trimmer.trims == 2


async def test_the_trimmer_polls_until_cancelled() -> None:
    calls: list[int] = []
    task = asyncio.create_task(AllocatorTrimmer(trim=calls.append, poll_s=0.01).run())  # type: ignore[arg-type]
    allocator.note_received(TRIM_AFTER_BYTES)
    for _ in range(500):  # until it has polled twice (the burst, then calm)
        if calls:
            break
        await asyncio.sleep(0.01)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert calls == [0]
