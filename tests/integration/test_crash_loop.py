"""No acknowledged loss: a real ``kernelgw serve`` (SQLite, then PostgreSQL) SIGKILLed at random
moments while cells run over REST, restarted each time (tests/support/crash_loop.py).
Every cell answered 200 is in history with that status, cells running at a kill
are marked, and no container of the gateway's name is left.
(benchmarks/bench_crash.py runs the same loop for 100 rounds and prints the counts.)

The kill times are random but seeded: the seed is printed (pytest shows it with a
failure) and is part of every assertion's message; ``KERNELGW_TEST_CRASH_SEED=N``
replays a run with seed N.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import docker
import pytest

from tests.integration.conftest import IMAGE
from tests.support.crash_loop import crash_rounds
from tests.support.postgres import postgres_url

pytestmark = pytest.mark.integration

ROUNDS = 10
SLOW_ROUNDS = 5


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest) -> str | None:
    if request.param == "sqlite":
        return None  # the gateway's default: a file in its data directory
    return postgres_url()


@pytest.fixture
def seed() -> int:
    """The kill times' seed: ``KERNELGW_TEST_CRASH_SEED`` or a fresh random one,
    printed so that a failing run can be replayed."""
    env = os.environ.get("KERNELGW_TEST_CRASH_SEED")
    value = int(env) if env else random.randrange(2**31)
    print(f"crash loop seed: {value} (replay with KERNELGW_TEST_CRASH_SEED={value})")
    return value


def test_kill_9_at_random_moments_loses_no_acknowledged_cell(
    docker_client: docker.DockerClient, tmp_path: Path, database_url: str | None, seed: int
) -> None:
    counts = crash_rounds(ROUNDS, tmp_path, IMAGE, seed=seed, database_url=database_url)
    replay = f"seed {seed}: {counts}"
    assert counts.rounds == ROUNDS, replay
    assert counts.acknowledged > 0, replay
    assert counts.lost == [], f"{replay}\n" + (tmp_path / "gateway.log").read_text()[-3000:]
    assert counts.unmarked == [], replay
    assert counts.leaked == [], replay


def test_cells_running_at_a_kill_9_are_marked_cut_off(
    docker_client: docker.DockerClient, tmp_path: Path, seed: int
) -> None:
    # a 0.3 s cell killed 100-150 ms in: its `running` row is stored, so the next
    # gateway must mark it (dead, "the gateway stopped while this cell ran")
    counts = crash_rounds(
        SLOW_ROUNDS, tmp_path, IMAGE, seed=seed, code="import time; time.sleep(0.3); 1+1", kill_after_send_s=(0.1, 0.15)
    )
    replay = f"seed {seed}: {counts}"
    assert counts.rounds == SLOW_ROUNDS, replay
    assert counts.lost == [], f"{replay}\n" + (tmp_path / "gateway.log").read_text()[-3000:]
    assert counts.unmarked == [], replay
    assert counts.cut_off >= SLOW_ROUNDS // 2, replay
    assert counts.leaked == [], replay
