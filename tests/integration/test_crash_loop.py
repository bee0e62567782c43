"""No acknowledged loss: a real ``kernelgw serve`` (SQLite, then PostgreSQL) SIGKILLed at random
moments while cells run over REST, restarted each time (tests/support/crash_loop.py).
Every cell answered 200 is in history with that status, cells running at a kill
are marked, and no container of the gateway's name is left.
(benchmarks/bench_crash.py runs the same loop for 100 rounds and prints the counts.)
"""

from __future__ import annotations

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


def test_kill_9_at_random_moments_loses_no_acknowledged_cell(
    docker_client: docker.DockerClient, tmp_path: Path, database_url: str | None
) -> None:
    counts = crash_rounds(ROUNDS, tmp_path, IMAGE, database_url=database_url)
    assert counts.rounds == ROUNDS
    assert counts.acknowledged > 0
    assert counts.lost == [], (tmp_path / "gateway.log").read_text()[-3000:]
    assert counts.unmarked == []
    assert counts.leaked == []


def test_cells_running_at_a_kill_9_are_marked_cut_off(docker_client: docker.DockerClient, tmp_path: Path) -> None:
    # a 0.3 s cell killed 100-150 ms in: its `running` row is stored, so the next
    # gateway must mark it (dead, "the gateway stopped while this cell ran")
    counts = crash_rounds(
        SLOW_ROUNDS, tmp_path, IMAGE, code="import time; time.sleep(0.3); 1+1", kill_after_send_s=(0.1, 0.15)
    )
    assert counts.rounds == SLOW_ROUNDS
    assert counts.lost == [], (tmp_path / "gateway.log").read_text()[-3000:]
    assert counts.unmarked == []
    assert counts.cut_off >= SLOW_ROUNDS // 2, counts
    assert counts.leaked == []
