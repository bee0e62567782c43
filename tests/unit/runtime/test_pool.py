"""Warm pool bookkeeping: hand-over, growth on misses, shrink when idle.

The pool only needs "something that starts and closes"; these stand-ins are
plain objects with a state, so the logic is tested without containers (the real
hand-over is in tests/integration/test_pool.py)."""

from __future__ import annotations

import asyncio
import itertools

from kernelgw.runtime.metrics import Metrics
from kernelgw.runtime.pool import PoolProfile, WarmPool


class Started:
    ids = itertools.count()

    def __init__(self) -> None:
        self.id = next(self.ids)
        self.state = "idle"
        self.closed = False

    async def close(self) -> None:
        self.closed = True
        self.state = "closed"


async def starter() -> Started:
    await asyncio.sleep(0)
    return Started()


async def settle(pool: WarmPool, ready: int) -> None:
    for _ in range(1000):
        if pool.ready == ready:
            return
        await asyncio.sleep(0.001)
    raise AssertionError(f"pool has {pool.ready} ready, expected {ready}")


def make(size: int = 2, max_size: int = 4, shrink: float = 60) -> tuple[WarmPool, Metrics]:
    metrics = Metrics()
    pool = WarmPool(
        PoolProfile("img", 256, 1.0),
        starter,
        size=size,
        max_size=max_size,  # type: ignore[arg-type]
        shrink_after_s=shrink,
        metrics=metrics,
    )
    return pool, metrics


async def test_fills_hands_over_each_kernel_once_and_refills() -> None:
    pool, metrics = make()
    pool.start()
    try:
        await settle(pool, 2)
        a, b = pool.take(), pool.take()
        assert a is not None and b is not None and a is not b
        await settle(pool, 2)
        c = pool.take()
        assert c is not None and c is not a and c is not b
        assert metrics.pool_hits._value.get() == 3  # type: ignore[attr-defined]
    finally:
        await pool.close()


async def test_miss_grows_the_target_up_to_max() -> None:
    pool, metrics = make(size=1, max_size=2)
    assert pool.take() is None  # nothing started yet
    assert pool.take() is None
    assert pool.take() is None
    assert pool.target == 2
    assert metrics.pool_misses._value.get() == 3  # type: ignore[attr-defined]
    pool.start()
    await settle(pool, 2)
    await pool.close()


async def test_dead_kernels_are_discarded_not_handed_over() -> None:
    pool, _ = make(size=2)
    pool.start()
    await settle(pool, 2)
    for kernel in list(pool._ready):
        kernel.state = "dead"
    assert pool.take() is None
    await pool.close()


async def test_shrinks_back_without_demand_and_close_stops_everything() -> None:
    pool, metrics = make(size=1, max_size=3, shrink=0.05)
    pool.target = 3
    pool.start()
    await settle(pool, 1)  # 3 were wanted, but no demand for > 0.05 s: back to 1
    kept = list(pool._ready)
    await pool.close()
    assert all(k.closed for k in kept)
    assert metrics.pool_ready._value.get() == 0  # type: ignore[attr-defined]


async def test_close_is_prompt_even_right_after_a_take() -> None:
    """Regression: with wait_for, a take() racing with close() made close() wait
    for the filler's next timeout (cancellation swallowed on Python 3.11)."""
    pool, _ = make(size=2, shrink=600)  # the filler would sleep 150 s between checks
    pool.start()
    await settle(pool, 2)
    assert pool.take() is not None
    async with asyncio.timeout(5):
        await pool.close()
