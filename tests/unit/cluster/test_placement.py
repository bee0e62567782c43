"""placement=load: fewest running sessions, then most free memory, then the receiving gateway."""

from __future__ import annotations

from datetime import UTC, datetime

from kernelgw.cluster.placement import least_loaded
from kernelgw.cluster.registry import Gateway

NOW = datetime(2026, 11, 26, tzinfo=UTC)


def gw(name: str, sessions: int, free: int | None) -> Gateway:
    return Gateway(name, f"http://{name}:8000", NOW, NOW, None, sessions, free)


def test_fewest_sessions_win() -> None:
    assert least_loaded([gw("a", 3, 9000), gw("b", 1, 100), gw("c", 2, 9000)], prefer="a").name == "b"


def test_on_equal_sessions_most_free_memory_wins() -> None:
    assert least_loaded([gw("a", 1, 1000), gw("b", 1, 5000)], prefer="a").name == "b"


def test_a_full_tie_stays_on_the_receiving_gateway() -> None:
    assert least_loaded([gw("a", 1, 1000), gw("b", 1, 1000)], prefer="b").name == "b"


def test_no_gateway_no_choice() -> None:
    assert least_loaded([], prefer="a") is None


def test_free_memory_differing_by_noise_is_a_tie() -> None:
    assert least_loaded([gw("a", 1, 20_000), gw("b", 1, 20_900)], prefer="a").name == "a"
    assert least_loaded([gw("a", 1, 20_000), gw("b", 1, 20_900), gw("c", 1, 30_000)], prefer="a").name == "c"


def test_without_the_receiving_gateway_among_the_ties_the_most_free_memory_wins() -> None:
    assert least_loaded([gw("b", 1, 20_000), gw("c", 1, 20_500), gw("a", 2, 90_000)], prefer="a").name == "c"
