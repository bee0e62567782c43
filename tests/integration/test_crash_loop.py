"""No acknowledged loss: a real ``kernelgw serve`` (SQLite) SIGKILLed at random
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

pytestmark = pytest.mark.integration

ROUNDS = 10


def test_kill_9_at_random_moments_loses_no_acknowledged_cell(
    docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    counts = crash_rounds(ROUNDS, tmp_path, IMAGE)
    assert counts.rounds == ROUNDS
    assert counts.acknowledged > 0
    assert counts.lost == [], (tmp_path / "gateway.log").read_text()[-3000:]
    assert counts.unmarked == []
    assert counts.leaked == []
