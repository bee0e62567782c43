"""A flooding session's share of the event loop (`LoopShare`): pure arithmetic."""

from __future__ import annotations

import pytest

from kernelgw.runtime.loop_share import LoopShare


def test_ordinary_output_within_the_burst_never_waits() -> None:
    budget = LoopShare(share=0.25, burst_s=0.025)
    t = 0.0
    for _ in range(5):  # five slices of 4 ms, back to back: 20 ms of the 25 ms burst
        assert budget.spent(t, t + 0.004) == 0
        t += 0.004


def test_a_flood_gets_its_share_and_no_more() -> None:
    budget = LoopShare(share=0.25, burst_s=0.025)
    t, busy = 0.0, 0.0
    for _ in range(2000):  # slices of 2 ms, each followed by the wait it is told
        wait = budget.spent(t, t + 0.002)
        t += 0.002 + wait
        busy += 0.002
    assert busy / t == pytest.approx(0.25, abs=0.01)


def test_the_bucket_refills_while_the_session_is_quiet_but_not_beyond_the_burst() -> None:
    budget = LoopShare(share=0.5, burst_s=0.01)
    assert budget.spent(0.0, 0.03) == pytest.approx(0.04)  # 20 ms over the burst: 40 ms at half the loop
    assert budget.spent(100.0, 100.009) == 0  # a long quiet refilled it, to 10 ms at most
    assert budget.spent(100.009, 100.013) > 0  # 1 ms left, 2 ms refilled, 4 ms taken


def test_a_share_outside_zero_to_one_is_refused() -> None:
    with pytest.raises(ValueError, match="share"):
        LoopShare(share=0, burst_s=0.01)
