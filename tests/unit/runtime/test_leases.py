"""Session terms on real kernel subprocesses with a real store: leases that end a
session when they run out (and are extended), a pause that fails, metadata, the
access token's check, and the bounds the runtime holds whatever face asked.

A lease that pauses copies the workspace with Python's tarfile here (the gate
of test_paused_restart.py); in a container, and terms across a gateway
restart: tests/integration/test_leases.py."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from kernelgw.config import Settings
from kernelgw.errors import BadRequest, LimitExceeded
from kernelgw.runtime.lease import LEASE_ENDED_REASON, access_sha256
from kernelgw.runtime.manager import SessionManager, SessionOptions
from kernelgw.runtime.metrics import Metrics
from kernelgw.runtime.session import KernelSession
from kernelgw.storage import audit
from kernelgw.storage.store import Store
from tests.support.local_backend import LocalBackend
from tests.support.waiting import until
from tests.unit.runtime.test_paused_restart import gate  # noqa: F401 (a fixture: pauses copy files with tarfile)
from tests.unit.runtime.test_session import run, stdout

ManagerFactory = Callable[..., SessionManager]
TOKEN = "e2b-access-token-of-this-sandbox"


@pytest.fixture
async def make_manager(local_backend: LocalBackend, store: Store, tmp_path: Path) -> AsyncIterator[ManagerFactory]:
    """Managers recording in ``store``. The reaper's period is an hour: a lease that
    ends within the test's deadline was ended by its own time, not by a round."""
    managers: list[SessionManager] = []

    def make(**overrides: Any) -> SessionManager:
        base = {
            "data_dir": tmp_path,
            "state_poll_s": 0.1,
            "pool_size": 0,
            "reap_interval_s": 3600,
            "on_shutdown": "stop",
        }
        manager = SessionManager(Settings(**{**base, **overrides}), local_backend, recorder=store, metrics=Metrics())
        managers.append(manager)
        return manager

    yield make
    for manager in managers:
        await manager.shutdown()


async def gone(manager: SessionManager, session: KernelSession, timeout: float = 20) -> None:
    async def ended() -> bool:
        return session.id not in {s.id for s in manager.list()}

    await until(ended, f"session {session.id} to end", timeout=timeout)


async def stored_lease(store: Store, session: KernelSession) -> tuple[datetime | None, str]:
    (stored,) = [s for s in await store.open_sessions() if s.session_id == session.id]
    return stored.lease_until, stored.on_lease_end


async def test_a_lease_ends_the_session_when_it_runs_out_with_its_reason_stored_and_audited(
    make_manager: ManagerFactory, store: Store, local_backend: LocalBackend
) -> None:
    manager = make_manager()
    await manager.start()
    before = datetime.now(UTC)
    session = await manager.create(SessionOptions(lease_s=1.0))
    assert session.lease_until is not None and session.on_lease_end == "end"
    assert (session.lease_until - before).total_seconds() >= 1.0
    assert session.info()["lease_until"] == session.lease_until
    assert await stored_lease(store, session) == (session.lease_until, "end")
    lease_until = session.lease_until
    await gone(manager, session)
    assert session.state == "closed" and not local_backend.running()
    record = await store.get_session(session.id)
    assert record is not None and record.end_reason == LEASE_ENDED_REASON
    assert record.ended_at is not None and record.ended_at >= lease_until  # never before its time
    (ended,) = await audit.query(store, session_id=session.id, kind="session_ended")
    assert ended.detail == LEASE_ENDED_REASON


async def test_set_lease_moves_the_end_later_and_sooner_and_is_stored(
    make_manager: ManagerFactory, store: Store
) -> None:
    manager = make_manager()
    await manager.start()
    shortened = await manager.create(SessionOptions(lease_s=3600.0))
    extended = await manager.create(SessionOptions(lease_s=3.0))
    await manager.set_lease(extended, 3600.0)
    assert extended.lease_until is not None and (extended.lease_until - datetime.now(UTC)).total_seconds() > 3000
    assert await stored_lease(store, extended) == (extended.lease_until, "end")  # acknowledged: stored
    # the keeper sleeps until the nearest end (an hour away now): a shorter lease wakes it
    await manager.set_lease(shortened, 0.5)
    await gone(manager, shortened)
    record = await store.get_session(shortened.id)
    assert record is not None and record.end_reason == LEASE_ENDED_REASON
    # a control whose lease ends after the extended one's first end: once it is
    # gone, that first end has passed and the keeper looked at both
    control = await manager.create(SessionOptions(lease_s=3.0))
    await gone(manager, control)
    assert manager.get(extended.id) is extended and extended.state == "idle"


@pytest.mark.usefixtures("gate")
async def test_a_lease_that_pauses_interrupts_the_running_cell_first(make_manager: ManagerFactory) -> None:
    """E2B pauses a sandbox whose timeout ran out whatever runs in it; a kernelgw
    pause needs the kernel between cells: the cell is interrupted (its variables
    kept), then the session paused, not ended."""
    manager = make_manager()
    await manager.start()
    session = await manager.create(SessionOptions(lease_s=2.0, on_lease_end="pause"))
    await run(session, "x = 41")
    running = session.submit("import time\ntime.sleep(60)")

    async def paused() -> bool:
        return session.state == "paused"

    await until(paused, "the lease to pause the session")
    assert (await running.done).status == "interrupted"
    assert session.lease_until is None
    assert stdout(await run(session, "print(x + 1)")) == "42\n"  # resumed, its variables back


async def test_a_lease_whose_pause_fails_ends_the_session_saying_why(
    make_manager: ManagerFactory, store: Store
) -> None:
    manager = make_manager(interrupt_grace_s=0.5)
    await manager.start()
    session = await manager.create(SessionOptions(lease_s=1.0, on_lease_end="pause"))
    # a cell that will not stop: every interrupt is caught
    running = session.submit(
        "import time\nwhile True:\n    try:\n        time.sleep(60)\n    except KeyboardInterrupt:\n        pass"
    )
    await gone(manager, session, timeout=60)
    record = await store.get_session(session.id)
    assert record is not None and record.end_reason is not None
    assert record.end_reason.startswith(LEASE_ENDED_REASON) and "could not be" in record.end_reason
    assert "idle" in record.end_reason  # the pause's own refusal, for a person to act on
    assert (await running.done).status == "dead"


async def test_a_session_under_a_lease_is_not_reaped_as_idle(make_manager: ManagerFactory) -> None:
    manager = make_manager(idle_timeout_s=0.2, reap_interval_s=0.05)
    leased = await manager.create(SessionOptions(lease_s=3600.0))
    plain = await manager.create()
    await manager.start()
    await gone(manager, plain)
    # the leased one was idle longer, and was looked at in the same round
    assert manager.get(leased.id) is leased and leased.state == "idle"


async def test_the_access_token_is_checked_by_its_hash(make_manager: ManagerFactory) -> None:
    manager = make_manager()
    guarded = await manager.create(SessionOptions(access_sha256=access_sha256(TOKEN)))
    open_ = await manager.create()
    assert guarded.check_access(TOKEN)
    assert not guarded.check_access(TOKEN + "x") and not guarded.check_access("")
    assert guarded.access_sha256 == access_sha256(TOKEN) and TOKEN not in str(guarded.info())
    assert not open_.check_access(TOKEN) and not open_.check_access("")  # no hash: nothing opens it


async def test_metadata_is_kept_read_only_and_a_fork_gets_it_but_not_the_lease_or_token(
    make_manager: ManagerFactory,
) -> None:
    manager = make_manager()
    labels = {"user": "ünï", "k" * 128: "v" * 1024}
    source = await manager.create(
        SessionOptions(metadata=labels, lease_s=600, on_lease_end="pause", access_sha256=access_sha256(TOKEN))
    )
    assert source.metadata == labels and source.info()["metadata"] == labels
    source.metadata["user"] = "changed"  # a copy: the session's own are unchanged
    assert source.metadata == labels
    # a fork (made from these options: tests/integration/test_leases.py forks for real)
    forked = manager.fork_options(source, SessionOptions())
    assert forked.metadata == labels
    assert (forked.lease_s, forked.on_lease_end, forked.access_sha256) == (None, "end", None)
    own = manager.fork_options(source, SessionOptions(metadata={"a": "b"}, lease_s=60, access_sha256="0" * 64))
    assert (own.metadata, own.lease_s, own.access_sha256) == ({"a": "b"}, 60, "0" * 64)


@pytest.mark.parametrize(
    ("opts", "error", "message"),
    [
        (SessionOptions(metadata={str(i): "" for i in range(65)}), BadRequest, "65 entries; at most 64"),
        (SessionOptions(metadata={"": "v"}), BadRequest, "1 to 128 characters"),
        (SessionOptions(metadata={"k" * 129: "v"}), BadRequest, "1 to 128 characters"),
        (SessionOptions(metadata={"k": "v" * 1025}), BadRequest, "at most 1024 characters"),
        (SessionOptions(metadata={"k": 1}), BadRequest, r"metadata\['k'\] must be a string"),  # type: ignore[dict-item]
        (SessionOptions(lease_s=0), LimitExceeded, "more than 0 and at most 86400 seconds"),
        (SessionOptions(lease_s=-5), LimitExceeded, "max_lease_s"),
        (SessionOptions(lease_s=86400.5), LimitExceeded, "got 86400.5"),
        (SessionOptions(lease_s=float("nan")), LimitExceeded, "max_lease_s"),
        (SessionOptions(on_lease_end="kill"), BadRequest, "on_lease_end"),  # type: ignore[arg-type]
        (SessionOptions(access_sha256="not-a-digest"), BadRequest, "64 lowercase hex"),
        (SessionOptions(access_sha256=access_sha256(TOKEN).upper()), BadRequest, "64 lowercase hex"),
    ],
)
async def test_terms_out_of_bounds_are_refused_before_a_kernel_starts(
    make_manager: ManagerFactory,
    local_backend: LocalBackend,
    opts: SessionOptions,
    error: type[Exception],
    message: str,
) -> None:
    manager = make_manager()
    with pytest.raises(error, match=message):
        await manager.create(opts)
    assert local_backend.started == 0 and len(manager) == 0


async def test_set_lease_is_bounded_by_max_lease_s(make_manager: ManagerFactory) -> None:
    manager = make_manager(max_lease_s=120)
    session = await manager.create(SessionOptions(lease_s=120))
    until_before = session.lease_until
    for seconds in (-1, 121):
        with pytest.raises(LimitExceeded, match="0 or more and at most 120 seconds"):
            await manager.set_lease(session, seconds)
    assert session.lease_until == until_before
    await manager.set_lease(session, 120)  # again the most, from now
    assert session.lease_until is not None and until_before is not None and session.lease_until >= until_before


async def test_a_lease_set_to_0_ends_the_session_at_once(make_manager: ManagerFactory, store: Store) -> None:
    """E2B's ``set_timeout(0)``: the lease runs out now, as if its timeout had."""
    manager = make_manager()
    await manager.start()
    session = await manager.create(SessionOptions(lease_s=3600.0))
    await manager.set_lease(session, 0)
    await gone(manager, session)
    record = await store.get_session(session.id)
    assert record is not None and record.end_reason == LEASE_ENDED_REASON
