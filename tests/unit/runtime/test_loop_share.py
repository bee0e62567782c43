"""A flooding session's share of the event loop (`LoopShare`): pure arithmetic."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kernelgw.runtime.loop_share import ACTIVE_S, MAX_WAIT_S, LoopShare, Readers


@pytest.fixture
def shares() -> Iterator[list[LoopShare]]:
    """Shares of one set of readers of their own (the process's may hold the
    sessions of other tests, read at real times, not this test's made-up ones)."""
    made: list[LoopShare] = []
    yield made
    for share in made:
        share.close()
    assert not made or not made[0].readers.last_read


def make(shares: list[LoopShare], share: float = 0.25, burst_s: float = 0.025) -> LoopShare:
    readers = shares[0].readers if shares else Readers()
    shares.append(LoopShare(share=share, burst_s=burst_s, readers=readers))
    return shares[-1]


def test_ordinary_output_within_the_burst_never_waits(shares: list[LoopShare]) -> None:
    budget, other = make(shares), make(shares)
    other.spent(0.0, 0.0)  # another session is active throughout
    t = 0.0
    for _ in range(5):  # five slices of 4 ms, back to back: 20 ms of the 25 ms burst
        assert budget.spent(0.004, t + 0.004) == 0
        t += 0.004


def test_a_flood_gets_its_share_while_another_session_is_active(shares: list[LoopShare]) -> None:
    budget, other = make(shares), make(shares)
    t, busy = 0.0, 0.0
    for _ in range(2000):  # slices of 2 ms, each followed by the wait it is told
        other.spent(0.0, t)  # the other session's output keeps coming
        wait = budget.spent(0.002, t + 0.002)
        t += 0.002 + wait
        busy += 0.002
    assert busy / t == pytest.approx(0.25, abs=0.01)


def test_a_flood_alone_takes_the_whole_loop_and_owes_nothing_after(shares: list[LoopShare]) -> None:
    budget, other = make(shares), make(shares)
    t = 0.0
    for _ in range(100):  # 200 ms of slices with nobody else around: never told to wait
        assert budget.spent(0.002, t + 0.002) == 0
        t += 0.002
    other.spent(0.0, t)  # somebody else's output now
    assert budget.spent(0.002, t + 0.002) > 0  # the share applies at once
    assert budget.spent(0.001, t + 1.001) == 0  # after a second's pause the burst is back
    assert t > ACTIVE_S


def test_a_closed_share_is_nobody_to_share_with(shares: list[LoopShare]) -> None:
    budget, other = make(shares), make(shares, burst_s=0.0)
    other.spent(0.0, 0.0)
    assert budget.spent(0.03, 0.03) > 0
    other.close()
    assert budget.spent(0.03, 0.06) == 0


def test_one_wait_is_never_long(shares: list[LoopShare]) -> None:
    """A reader that waited a second would make its kernel's iopub look quiet."""
    budget, other = make(shares), make(shares)
    other.spent(0.0, 1.0)
    assert budget.spent(0.5, 1.0) == MAX_WAIT_S  # half a second of one batch: 2 s owed, 0.1 s waited


def test_a_share_outside_zero_to_one_is_refused() -> None:
    with pytest.raises(ValueError, match="share"):
        LoopShare(share=0, burst_s=0.01)
