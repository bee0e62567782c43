"""`kernelgw serve --workers N`: each worker's settings derived from the gateway's
(pure logic; tests/integration/test_workers.py runs the processes)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import CliRunner
from pydantic import SecretStr, ValidationError
from sqlalchemy import insert

from kernelgw.cli.main import main
from kernelgw.cluster.node import Cluster
from kernelgw.config import Settings
from kernelgw.server.workers import (
    SharedSecrets,
    Supervisor,
    WorkerNameTooLong,
    bind_socket,
    private_host,
    private_url,
    restart_delay,
    worker_name,
    worker_settings,
)
from kernelgw.storage import Store, schema
from tests.support.app import local_settings


def settings(tmp_path: Path, **overrides: object) -> Settings:
    values: dict[str, object] = {"data_dir": tmp_path, "gateway_name": "gw", "workers": 3, **overrides}
    return Settings(**values)  # type: ignore[arg-type]


def test_the_first_worker_keeps_the_name_the_others_are_numbered() -> None:
    assert [worker_name("gw", i) for i in range(3)] == ["gw", "gw-w1", "gw-w2"]


def test_each_worker_is_a_cluster_node_with_the_shared_secrets(tmp_path: Path) -> None:
    s = settings(tmp_path)
    shared = SharedSecrets.of(s)
    assert not shared.cluster_from_user
    plans = [worker_settings(s, i, private_url(s, shared, 40000 + i), shared) for i in range(3)]
    assert [p.gateway_name for p in plans] == ["gw", "gw-w1", "gw-w2"]
    assert [p.advertise_url for p in plans] == [f"http://127.0.0.1:{40000 + i}" for i in range(3)]
    assert all(p.cluster and p.workers == 1 for p in plans)  # a worker never starts workers of its own
    assert {p.cluster_secret.get_secret_value() for p in plans if p.cluster_secret} == {
        shared.cluster_secret.get_secret_value()
    }
    # browser tokens minted by one worker verify on the others
    assert {p.token_secret.get_secret_value() for p in plans if p.token_secret} == {
        shared.token_secret.get_secret_value()
    }
    # the public address is the gateway's, unchanged
    assert {(p.host, p.port) for p in plans} == {(s.host, s.port)}
    assert s.cluster_secret is None and s.gateway_name == "gw"  # the gateway's own settings are not touched


def test_generated_secrets_are_random_and_kept_out_of_reprs(tmp_path: Path) -> None:
    s = settings(tmp_path)
    a, b = SharedSecrets.of(s), SharedSecrets.of(s)
    assert a.cluster_secret.get_secret_value() != b.cluster_secret.get_secret_value()
    assert len(a.cluster_secret.get_secret_value()) >= 32
    plan = worker_settings(s, 1, "http://127.0.0.1:1", a)
    assert a.cluster_secret.get_secret_value() not in repr(plan)
    assert a.token_secret.get_secret_value() not in repr(plan)


def test_the_users_secrets_are_kept(tmp_path: Path) -> None:
    s = settings(tmp_path, cluster_secret=SecretStr("c" * 40), token_secret=SecretStr("t" * 40))
    shared = SharedSecrets.of(s)
    assert shared.cluster_from_user
    plan = worker_settings(s, 2, "http://10.0.0.5:41000", shared)
    assert plan.cluster_secret is not None and plan.cluster_secret.get_secret_value() == "c" * 40
    assert plan.token_secret is not None and plan.token_secret.get_secret_value() == "t" * 40


def test_workers_past_the_first_keep_snapshots_apart_on_the_same_database(tmp_path: Path) -> None:
    s = settings(tmp_path)
    shared = SharedSecrets.of(s)
    first, second = (worker_settings(s, i, "http://127.0.0.1:1", shared) for i in (0, 1))
    assert first.data_dir == tmp_path and first.database_url is None  # as a gateway of one process
    assert second.data_dir == tmp_path / "workers" / "gw-w1"
    assert second.database_url == f"sqlite+aiosqlite:///{tmp_path.resolve() / 'kernelgw.db'}"
    pg = settings(tmp_path, database_url="postgresql://u:p@db/kgw")
    assert worker_settings(pg, 1, "http://127.0.0.1:1", shared).database_url == "postgresql://u:p@db/kgw"


def test_across_hosts_the_private_listener_is_reachable_where_the_gateway_is(tmp_path: Path) -> None:
    local = settings(tmp_path, host="0.0.0.0")
    assert private_host(local, SharedSecrets.of(local)) == "127.0.0.1"
    clustered = settings(
        tmp_path, host="0.0.0.0", cluster_secret=SecretStr("s" * 40), advertise_url="http://10.0.0.5:8000"
    )
    shared = SharedSecrets.of(clustered)
    assert private_host(clustered, shared) == "0.0.0.0"
    assert private_url(clustered, shared, 41234) == "http://10.0.0.5:41234"
    v6 = settings(tmp_path, host="::", cluster_secret=SecretStr("s" * 40), advertise_url="http://[fd00::5]:8000")
    assert private_url(v6, SharedSecrets.of(v6), 41234) == "http://[fd00::5]:41234"


def test_a_worker_name_past_63_characters_is_refused(tmp_path: Path) -> None:
    s = settings(tmp_path, gateway_name="g" * 60, workers=12)
    shared = SharedSecrets.of(s)
    assert worker_settings(s, 9, "http://127.0.0.1:1", shared).gateway_name == "g" * 60 + "-w9"
    with pytest.raises(WorkerNameTooLong, match="shorter --gateway-name"):
        worker_settings(s, 10, "http://127.0.0.1:1", shared)


def test_a_crash_loop_backs_off() -> None:
    delays = [restart_delay(n) for n in range(1, 10)]
    assert delays[0] == 0.5
    assert delays == sorted(delays)
    assert delays[-1] == 30.0


def test_the_setting_and_the_option(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().workers == 1
    monkeypatch.setenv("KERNELGW_WORKERS", "4")
    assert Settings.load().workers == 4
    monkeypatch.setenv("KERNELGW_WORKERS", "0")
    with pytest.raises(ValidationError):
        Settings.load()
    help_text = CliRunner().invoke(main, ["serve", "--help"]).output
    assert "--workers" in help_text and "KERNELGW_WORKERS" in help_text


def test_a_port_someone_listens_on_is_refused_before_any_worker_starts(tmp_path: Path) -> None:
    """The supervisor's check: a plain listener is refused where any socket
    listens, with SO_REUSEPORT (another supervisor's workers) or without."""
    taken = bind_socket("127.0.0.1", 0, reuse_port=True)
    port = taken.getsockname()[1]
    with taken:
        with pytest.raises(OSError):
            bind_socket("127.0.0.1", port)
        with pytest.raises(OSError):
            Supervisor(settings(tmp_path, host="127.0.0.1", port=port)).prepare()
    bind_socket("127.0.0.1", port).close()  # free again


def test_without_the_users_secret_the_workers_are_a_cluster_of_their_own(tmp_path: Path) -> None:
    s = settings(tmp_path)
    plan = worker_settings(s, 1, "http://127.0.0.1:1", SharedSecrets.of(s))
    assert plan.cluster_peers == ["gw", "gw-w1", "gw-w2"]
    joined = settings(tmp_path, cluster_secret=SecretStr("s" * 40))
    assert worker_settings(joined, 1, "http://127.0.0.1:1", SharedSecrets.of(joined)).cluster_peers is None


async def test_gateways_outside_the_peers_are_neither_listed_nor_owners(tmp_path: Path) -> None:
    """On a real SQLite store: another host's gateway sharing the database, and its
    open session, are invisible to a registry restricted to its peers."""
    base = local_settings(tmp_path, cluster_secret="s", gateway_name="gw", port=8101)
    store = Store.from_settings(base)
    await store.start()  # migrates: the registry table exists
    await store.close()
    other = Cluster(base.model_copy(update={"gateway_name": "elsewhere", "port": 8109}), running_sessions=lambda: 0)
    sibling = Cluster(base.model_copy(update={"gateway_name": "gw-w1", "port": 8102}), running_sessions=lambda: 0)
    peers = ["gw", "gw-w1"]
    mine = Cluster(base.model_copy(update={"cluster_peers": peers}), running_sessions=lambda: 0)
    await other.start()
    await sibling.start()
    await mine.start()
    try:
        async with mine.engine.begin() as conn:
            for sid, gateway in (("s-else", "elsewhere"), ("s-sib", "gw-w1")):
                await conn.execute(
                    insert(schema.sessions).values(
                        id=sid, gateway_name=gateway, image="i", created_at=datetime.now(UTC), kernel_name="python3"
                    )
                )
        await mine.registry.beat()
        assert {g.name for g in mine.registry.live()} == {"gw", "gw-w1"}
        assert await mine.registry.reread("elsewhere") is None
        assert await mine.registry.owner_of(["s-else"]) is None
        owner = await mine.registry.owner_of(["s-sib"])
        assert owner is not None and owner.gateway_name == "gw-w1"
        await other.registry.beat()  # the unrestricted one still sees everyone
        assert {g.name for g in other.registry.live()} == {"gw", "gw-w1", "elsewhere"}
    finally:
        for cluster in (mine, sibling, other):
            await cluster.close()
