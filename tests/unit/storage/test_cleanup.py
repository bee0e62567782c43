"""The store's purge of old history (kernelgw/storage/cleanup.py): no longer part of
the store's start (a restart's first answers do not wait for it), and still made
soon after it, also when ``purge_interval_s`` is 0 (then never again) or shorter
than the first purge's delay."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from kernelgw.storage import cleanup
from kernelgw.storage.cleanup import Cleanup
from kernelgw.storage.database import Database
from kernelgw.storage.store import Store
from tests.support.stand_ins import stand_in_session


def _cleanup(tmp_path: Path, interval_s: float) -> Cleanup:
    db = Database(f"sqlite+aiosqlite:///{tmp_path / 'h.db'}", "process")  # the loop never opens it
    return Cleanup(
        db, "gw", durability="process", retention_days=1, audit_retention_days=1, purge_interval_s=interval_s
    )


class Purges:
    def __init__(self) -> None:
        self.calls = 0
        self.made = asyncio.Event()

    async def __call__(self) -> int:
        self.calls += 1
        self.made.set()
        return 0


async def test_with_no_interval_one_purge_is_made_after_the_delay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cleanup, "FIRST_PURGE_DELAY_S", 0.01)
    purges, c = Purges(), _cleanup(tmp_path, 0)
    c.start_purging(purges)
    assert c._purger is not None
    await asyncio.wait_for(c._purger, 10)  # the loop ends after the one purge
    assert purges.calls == 1


async def test_an_interval_shorter_than_the_delay_starts_the_purges_sooner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cleanup, "FIRST_PURGE_DELAY_S", 3600)
    purges, c = Purges(), _cleanup(tmp_path, 0.01)
    c.start_purging(purges)
    try:
        await asyncio.wait_for(purges.made.wait(), 10)
    finally:
        await c.stop_purging()


async def test_the_store_starts_without_purging(tmp_path: Path) -> None:
    """An ended session past its retention is still there once `start` returned (the
    purge comes later), and goes at the purge."""
    url = f"sqlite:///{tmp_path / 'h.db'}"
    old = stand_in_session("old")
    first = Store(url, gateway_name="gw", purge_interval_s=0)
    await first.start()
    try:
        await first.session_started(old)
        await first.session_ended(old, "deleted")
    finally:
        await first.close()
    store = Store(url, gateway_name="gw", retention_days=0, purge_interval_s=0)
    await store.start()
    try:
        assert await store.get_session(old.id) is not None
        assert await store.purge(datetime.now(UTC) + timedelta(seconds=1)) == 1
        assert await store.get_session(old.id) is None
    finally:
        await store.close()
