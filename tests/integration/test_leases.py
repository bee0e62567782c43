"""Session terms on real containers: a lease that pauses a session (its files and
variables kept), a gateway restart that keeps metadata, lease and access hash
of a live session and of a paused one, a lease that ran out while no gateway
ran (ended at once by the next), and a fork that copies metadata only.

The gateway is the session manager itself, in-process, over the Docker backend
and a store on SQLite; a restart is a new manager and store of the same name
(``on_shutdown=keep``), as `kernelgw serve` does."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import docker
import pytest
from sqlalchemy import create_engine, update

from kernelgw.config import Settings
from kernelgw.keys import ANONYMOUS
from kernelgw.runtime.backends import create_backend
from kernelgw.runtime.lease import LEASE_ENDED_REASON, LEASE_PAUSED_REASON, access_sha256
from kernelgw.runtime.manager import SessionManager, SessionOptions
from kernelgw.runtime.session import KernelSession
from kernelgw.storage import audit, schema
from kernelgw.storage.store import Store
from tests.integration.conftest import assert_nothing_left, gateway_settings, remove_everything
from tests.support.waiting import until

pytestmark = pytest.mark.integration

LIVE, PAUSED = "token-of-the-live-one", "token-of-the-paused-one"


@asynccontextmanager
async def gateway(settings: Settings, db: Path) -> AsyncIterator[tuple[SessionManager, Store]]:
    """A manager and its store, started as the gateway starts them, shut down as it stops."""
    store = Store(f"sqlite:///{db}", gateway_name=settings.gateway_name, purge_interval_s=0)
    await store.start()
    manager = SessionManager(settings, create_backend(settings), recorder=store)
    try:
        await manager.start()
        yield manager, store
    finally:
        await manager.shutdown()
        await manager.backend.close()
        await store.close()


async def state_is(session: KernelSession, state: str) -> Callable[[], Awaitable[bool]]:
    async def reached() -> bool:
        return session.state == state

    return reached


async def test_terms_outlive_a_gateway_restart_and_leases_pause_end_and_fork_as_told(
    docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    name = f"lease{os.getpid() % 100000}{secrets.token_hex(2)}"
    settings = gateway_settings(gateway_name=name, data_dir=tmp_path, on_shutdown="keep", reap_interval_s=3600)
    db = tmp_path / "history.db"
    try:
        async with gateway(settings, db) as (manager, store):
            live = await manager.create(
                SessionOptions(
                    metadata={"who": "live"}, lease_s=600, on_lease_end="pause", access_sha256=access_sha256(LIVE)
                )
            )
            paused = await manager.create(
                SessionOptions(
                    metadata={"who": "paused"}, lease_s=600, on_lease_end="pause", access_sha256=access_sha256(PAUSED)
                )
            )
            expiring = await manager.create(SessionOptions(metadata={"who": "expiring"}, lease_s=600))
            for session in (live, paused):
                assert (await session.submit("x = 41").done).status == "ok"
            await manager.set_lease(paused, 1)  # after its cell: a cell sent as it pauses would resume it
            await until(await state_is(paused, "paused"), "its lease to pause the session")
            assert paused.lease_until is None and manager.get(paused.id) is paused
            (event,) = await audit.query(store, session_id=paused.id, kind="session_paused")
            assert event.detail is not None and event.detail.startswith(LEASE_PAUSED_REASON)
            lease_of_live = live.lease_until
        # no gateway runs: the expiring one's lease runs out meanwhile
        past = datetime.now(UTC) - timedelta(minutes=1)
        database = create_engine(f"sqlite:///{db}")
        with database.begin() as conn:
            conn.execute(update(schema.sessions).where(schema.sessions.c.id == expiring.id).values(lease_until=past))
        database.dispose()

        async with gateway(settings, db) as (manager, store):
            # ended at once by the lease keeper's first round
            async def expired() -> bool:
                record = await store.get_session(expiring.id)
                return record is not None and record.ended_at is not None

            await until(expired, "the run-out lease to end the session")
            record = await store.get_session(expiring.id)
            assert record is not None and record.end_reason == LEASE_ENDED_REASON
            assert {s.id for s in manager.list()} == {live.id, paused.id}

            back = manager.get(live.id)
            assert back.metadata == {"who": "live"} and back.on_lease_end == "pause"
            assert back.lease_until == lease_of_live
            assert back.check_access(LIVE) and not back.check_access(PAUSED)
            assert (await back.submit("assert x == 41").done).status == "ok"  # the same kernel

            again = manager.get(paused.id)
            assert again.state == "paused" and again.lease_until is None
            assert again.metadata == {"who": "paused"} and again.check_access(PAUSED)
            assert await again.resume() is not None
            assert again.lease_until is None  # a resume starts no lease by itself
            assert (await again.submit("assert x == 41").done).status == "ok"
            await manager.set_lease(again, 120)
            (stored,) = [s for s in await store.open_sessions() if s.session_id == again.id]
            assert stored.lease_until is not None and stored.lease_until == manager.get(again.id).lease_until

            fork, _ = await manager.fork(back, SessionOptions(), ANONYMOUS)
            assert fork.metadata == {"who": "live"}
            assert fork.lease_until is None and fork.on_lease_end == "end" and not fork.check_access(LIVE)
            assert (await fork.submit("assert x == 41").done).status == "ok"  # replayed
            await asyncio.gather(*(manager.delete(s.id) for s in manager.list()))
        assert_nothing_left(docker_client, name)
    finally:
        remove_everything(docker_client, name)


async def test_a_cell_sent_while_the_session_pauses_resumes_it_and_runs(
    docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    """A lease runs out whenever it does, also as a client sends a cell: the pause
    holds the cell, and once paused the session must resume for it (the cell
    waited forever before: seen in the test above, 1 run in 4)."""
    name = f"lease{os.getpid() % 100000}{secrets.token_hex(2)}"
    settings = gateway_settings(gateway_name=name, data_dir=tmp_path, reap_interval_s=3600)
    try:
        async with gateway(settings, tmp_path / "history.db") as (manager, _):
            session = await manager.create()
            assert (await session.submit("x = 41").done).status == "ok"
            pausing = asyncio.create_task(manager.pause(session, reason=LEASE_PAUSED_REASON))
            await asyncio.sleep(0)  # one turn: the pause holds the queue and waits on the kernel
            assert session.state == "idle" and not pausing.done()
            cell = session.submit("print(x + 1)")
            await pausing
            async with asyncio.timeout(120):
                done = await cell.done
            assert done.status == "ok" and session.state == "idle"
            events = [json.loads(text) for _, text in session.events_since(0)]
            printed = [e["text"] for e in events if e["type"] == "stream" and e["execution_id"] == cell.execution_id]
            assert printed == ["42\n"]  # in the restored state
            await manager.delete(session.id)
        assert_nothing_left(docker_client, name)
    finally:
        remove_everything(docker_client, name)
