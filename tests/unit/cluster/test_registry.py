"""The gateway registry on a real SQLite store (migrated by the store itself):
rows, heartbeats, liveness, a clean stop, who owns an open session, listings."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import insert, update

from kernelgw.cluster.node import Cluster
from kernelgw.cluster.registry import GatewayRegistry, free_memory_mb
from kernelgw.config import Settings
from kernelgw.errors import GatewayNameInUse
from kernelgw.keys import ANONYMOUS, Principal
from kernelgw.storage import Store, schema
from tests.support.app import local_settings


@pytest.fixture
async def store_settings(tmp_path: Path) -> AsyncIterator[Settings]:
    settings = local_settings(tmp_path, cluster_secret="s", gateway_name="gw-a", port=8101)
    store = Store.from_settings(settings)
    await store.start()  # migrates: the registry table exists
    await store.close()
    yield settings


async def _session_row(cluster: Cluster, sid: str, gateway: str, owner: str | None, ended: bool = False) -> None:
    async with cluster.engine.begin() as conn:
        await conn.execute(
            insert(schema.sessions).values(
                id=sid,
                gateway_name=gateway,
                image="kernelgw/python:latest",
                created_at=datetime.now(UTC),
                ended_at=datetime.now(UTC) if ended else None,
                owner=owner,
                kernel_name="python3",
                kernel='{"spec": {"runtime": "runc", "memory_mb": 512, "cpus": 1.0}, "paused": false}',
                execution_count=2,
                last_seq=9,
            )
        )


async def test_gateways_register_heartbeat_and_see_each_other(store_settings: Settings) -> None:
    a = Cluster(store_settings, running_sessions=lambda: 2)
    b = Cluster(store_settings.model_copy(update={"gateway_name": "gw-b", "port": 8102}), running_sessions=lambda: 0)
    await a.start()
    await b.start()
    try:
        await a.registry.beat()
        live = {g.name: g for g in a.registry.live()}
        assert set(live) == {"gw-a", "gw-b"}
        assert live["gw-a"].url == "http://127.0.0.1:8101" and live["gw-a"].sessions == 2
        assert live["gw-b"].url == "http://127.0.0.1:8102" and live["gw-b"].sessions == 0
        assert a.settings.placement == "local" and a.placement_target() is None
        loaded = Cluster(store_settings.model_copy(update={"placement": "load"}), running_sessions=lambda: 2)
        loaded.registry._gateways = a.registry._gateways
        target = loaded.placement_target()
        assert target is not None and target.name == "gw-b"
        await loaded.close()
    finally:
        await b.close()
        await a.registry.refresh()
        gone = a.registry.gateway("gw-b")
        assert gone is not None and gone.stopped_at is not None and not a.registry.is_live(gone)
        assert "stopped at" in gone.last_seen()
        await a.close()


async def test_a_gateway_without_a_fresh_heartbeat_is_gone(store_settings: Settings) -> None:
    a = Cluster(store_settings, running_sessions=lambda: 0)
    await a.start()
    try:
        old = datetime.now(UTC) - timedelta(seconds=store_settings.cluster_gone_after_s + 1)
        async with a.engine.begin() as conn:
            await conn.execute(
                insert(schema.gateways).values(
                    name="gw-dead", advertise_url="http://x:1", started_at=old, heartbeat_at=old, sessions=0
                )
            )
        await a.registry.refresh()
        dead = a.registry.gateway("gw-dead")
        assert dead is not None and not a.registry.is_live(dead)
        assert "last heartbeat" in dead.last_seen()
        async with a.engine.begin() as conn:
            await conn.execute(
                update(schema.gateways)
                .where(schema.gateways.c.name == "gw-dead")
                .values(heartbeat_at=datetime.now(UTC))
            )
        back = await a.registry.reread("gw-dead")  # no wait for the next heartbeat's copy
        assert back is not None and a.registry.is_live(back) and a.registry.gateway("gw-dead") == back
        assert await a.registry.reread("never-was") is None
    finally:
        await a.close()


async def test_owner_lookup_and_listing_see_open_sessions_only(store_settings: Settings) -> None:
    a = Cluster(store_settings, running_sessions=lambda: 0)
    b = Cluster(store_settings.model_copy(update={"gateway_name": "gw-b", "port": 8102}), running_sessions=lambda: 0)
    await a.start()
    await b.start()
    try:
        await _session_row(a, "s-open", "gw-b", owner="k1")
        await _session_row(a, "s-other-key", "gw-b", owner="k2")
        await _session_row(a, "s-ended", "gw-b", owner="k1", ended=True)
        await _session_row(a, "s-mine", "gw-a", owner="k1")
        await a.registry.refresh()
        owner = await a.registry.owner_of(["s-open"])
        assert owner is not None and (owner.gateway_name, owner.owner_key) == ("gw-b", "k1")
        assert await a.registry.owner_of(["s-ended"]) is None
        assert await a.registry.owner_of(["nope", "s-mine"]) is not None
        alice = Principal(key_id="k1", name="alice", role="user")
        listed = await a.remote_sessions(alice)
        assert [s.id for s in listed] == ["s-open"]  # not another key's, not ended, not its own gateway's
        info = listed[0].info()
        assert (info["state"], info["memory_mb"], info["execution_count"], info["last_seq"]) == ("idle", 512, 2, 9)
        assert {s.id for s in await a.remote_sessions(ANONYMOUS)} == {"s-open", "s-other-key"}
        assert (await a.held_elsewhere("k1"), await a.held_elsewhere("k2"), await a.held_elsewhere("k3")) == (1, 1, 0)
        await b.close()  # gone: its sessions leave the listing
        await a.registry.refresh()
        assert await a.remote_sessions(ANONYMOUS) == []
    finally:
        await a.close()


async def test_a_live_gateway_of_the_same_name_elsewhere_is_refused(store_settings: Settings) -> None:
    a = Cluster(store_settings, running_sessions=lambda: 0)
    await a.start()
    try:
        twin = Cluster(store_settings.model_copy(update={"port": 8109}), running_sessions=lambda: 0)
        with pytest.raises(GatewayNameInUse) as caught:
            await twin.registry.check_name()
        assert "http://127.0.0.1:8101" in caught.value.message and "KERNELGW_GATEWAY_NAME" in caught.value.message
        await twin.close(registered=False)
        again = Cluster(store_settings, running_sessions=lambda: 0)  # the same address: a restart
        await again.registry.check_name()
        await again.close(registered=False)
    finally:
        await a.close()
    after = Cluster(store_settings.model_copy(update={"port": 8109}), running_sessions=lambda: 0)
    await after.registry.check_name()  # stopped: the name is free
    await after.close(registered=False)


def test_free_memory_is_read_from_meminfo(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemAvailable:   2048000 kB\n")
    assert free_memory_mb(meminfo) == 2000
    assert free_memory_mb(tmp_path / "missing") is None


def test_advertise_url_defaults_to_the_listen_address() -> None:
    assert Settings(host="10.1.2.3", port=9000).own_url() == "http://10.1.2.3:9000"
    assert Settings(advertise_url="http://gw-a.internal:8000/").own_url() == "http://gw-a.internal:8000"
    assert "://" in Settings(host="0.0.0.0").own_url() and "0.0.0.0" not in Settings(host="0.0.0.0").own_url()
    with pytest.raises(ValueError, match="advertise_url"):
        Settings(advertise_url="gw-a:8000")
    with pytest.raises(ValueError, match="cluster_gone_after_s"):
        Settings(cluster_heartbeat_s=10, cluster_gone_after_s=5)


def test_a_registry_alone_is_no_cluster() -> None:
    assert not Settings().cluster and Settings(cluster_secret="x").cluster
    assert GatewayRegistry.__doc__
