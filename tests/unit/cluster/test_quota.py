"""A key's session quota spans the cluster: sessions it holds on other gateways
(what ``held_elsewhere`` reports from the store) count on this one too."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelgw.config import Settings
from kernelgw.errors import SessionLimitReached
from kernelgw.keys import KeyQuotas, Principal
from kernelgw.runtime.manager import SessionManager
from kernelgw.runtime.metrics import Metrics
from tests.support.local_backend import LocalBackend


async def test_sessions_on_other_gateways_count_against_the_keys_quota(
    local_backend: LocalBackend, tmp_path: Path
) -> None:
    settings = Settings(data_dir=tmp_path, max_memory_mb=2048, state_poll_s=0.1, pool_size=0, max_sessions_per_key=2)
    manager = SessionManager(settings, local_backend, metrics=Metrics())
    elsewhere = {"alice": 1, "bob": 0}
    asked: list[str] = []

    async def held_elsewhere(key_id: str) -> int:
        asked.append(key_id)
        return elsewhere[key_id]

    manager.held_elsewhere = held_elsewhere
    alice = Principal(key_id="alice", name="alice", role="user")
    bob = Principal(key_id="bob", name="bob", role="user", quotas=KeyQuotas(max_sessions=1))
    try:
        await manager.create(principal=alice)  # one here + one elsewhere: at her quota of two
        with pytest.raises(SessionLimitReached, match="API key"):
            await manager.create(principal=alice)
        elsewhere["alice"] = 0  # her other session ended
        await manager.create(principal=alice)
        await manager.create(principal=bob)
        with pytest.raises(SessionLimitReached, match="maximum of 1"):
            await manager.create(principal=bob)
        assert set(asked) == {"alice", "bob"}
    finally:
        await manager.shutdown()
