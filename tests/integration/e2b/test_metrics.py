"""E2B's sandbox metrics through E2B's SDK on real containers: the engine's CPU
and memory of the kernel's container, against its limits, and its workspace's
tmpfs as disk; one reading taken now; none for a paused sandbox."""

from __future__ import annotations

import pytest
from e2b_code_interpreter import Sandbox

from tests.integration.e2b.conftest import E2BGateway

pytestmark = pytest.mark.integration

MIB = 1024 * 1024


def test_metrics_are_the_containers_use_of_its_limits(sbx: Sandbox, e2b_env: E2BGateway) -> None:
    settings = e2b_env.gateway.settings
    (idle,) = sbx.get_metrics()
    assert idle.cpu_count == max(1, int(-(-settings.cpus // 1)))
    assert idle.mem_total == settings.memory_mb * MIB  # the container's limit
    assert 0 < idle.mem_used < idle.mem_total
    assert idle.disk_total == settings.workspace_size_mb * MIB  # the workspace's tmpfs
    assert 0 <= idle.disk_used < 2 * MIB
    # 8 MiB written to the workspace: disk in use (and memory: a tmpfs is memory)
    assert sbx.run_code("open('/home/user/blob.bin', 'wb').write(b'x' * (8 << 20))").error is None
    (wrote,) = sbx.get_metrics()
    assert wrote.disk_used >= idle.disk_used + 8 * MIB
    assert wrote.mem_used >= 8 * MIB


def test_a_paused_sandbox_has_no_reading(sbx: Sandbox) -> None:
    sbx.pause()
    assert sbx.get_metrics() == []
    assert sbx.run_code("1 + 1").text == "2"  # resumed by its traffic
    assert len(sbx.get_metrics()) == 1
