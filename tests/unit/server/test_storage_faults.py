"""Storage faults, in-process on real kernel subprocesses and a real SQLite file:
a full disk (a small tmpfs filled by a file) and a deleted data directory.
While the store cannot write, new sessions and executes are refused (503,
``Retry-After``) and ``/readyz`` says why; when writes work again it recovers by
itself and the rows it held back are in the history."""

from __future__ import annotations

import asyncio
import os
import shutil
import sqlite3
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from kernelgw.server.state import gateway_state
from kernelgw.storage.store import DB_FILE
from tests.support.app import local_settings, serve
from tests.support.local_backend import LocalBackend

DEADLINE_S = 60.0
BIG_CELL = "print('x' * 400_000)"
"""Output that needs fresh pages in the database (a write that a full disk refuses)."""


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def fill(directory: Path) -> Path:
    """Write a file until the file system is full, down to the byte; returns it."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        for size in (65536, 4096, 512, 1):
            chunk = b"\0" * size
            try:
                while True:
                    os.write(fd, chunk)
            except OSError:
                continue
    finally:
        os.close(fd)
    return filler


async def wait_until(check: object, what: str) -> None:
    assert callable(check)
    deadline = time.monotonic() + DEADLINE_S
    while not await check():
        assert time.monotonic() < deadline, f"never: {what}"
        await asyncio.sleep(0.05)


async def ready(http: httpx.AsyncClient) -> bool:
    return (await http.get("/readyz")).status_code == 200


@pytest.fixture
async def gateway(
    local_backend: LocalBackend, small_tmpfs: Path
) -> AsyncIterator[tuple[httpx.AsyncClient, object, Path]]:
    async with serve(local_settings(small_tmpfs, on_shutdown="stop"), local_backend) as (app, client):
        yield client, app, small_tmpfs


async def test_a_full_disk_refuses_new_work_with_503_and_recovers_when_space_is_freed(
    gateway: tuple[httpx.AsyncClient, object, Path],
) -> None:
    http, _, data_dir = gateway
    sid = (await http.post("/v1/sessions", json={})).json()["id"]
    assert (await http.post(f"/v1/sessions/{sid}/execute", json={"code": "x = 1"})).status_code == 200
    assert await ready(http)

    filler = fill(data_dir)
    first = await http.post(f"/v1/sessions/{sid}/execute", json={"code": BIG_CELL})
    assert first.status_code in (200, 503), first.text  # the write it queued is what fails
    await wait_until(lambda: _not(ready(http)), "/readyz turns 503 on a full disk")

    refused = await http.post(f"/v1/sessions/{sid}/execute", json={"code": "x += 1"})
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "storage_unavailable"
    assert int(refused.headers["Retry-After"]) > 0
    assert "cannot write" in refused.json()["error"]["message"]
    created = await http.post("/v1/sessions", json={})
    assert created.status_code == 503 and "Retry-After" in created.headers
    health = await http.get("/healthz")
    assert health.status_code == 200  # liveness: a restart would not free the disk
    assert health.json()["status"] == "degraded" and "cannot write" in health.json()["storage"]
    readyz = (await http.get("/readyz")).json()
    assert "storage" in readyz["detail"]

    filler.unlink()
    await wait_until(lambda: ready(http), "/readyz 200 again once the disk has room")
    again = await http.post(f"/v1/sessions/{sid}/execute", json={"code": "x += 1\nx"})
    assert again.status_code == 200, again.text
    assert (await http.get("/healthz")).json()["status"] == "ok"
    history = (await http.get(f"/v1/sessions/{sid}/history")).json()
    codes = [e["code"] for e in history["executions"]]
    # the cell that ran during the fault was held back and written, not dropped
    assert codes == ["x = 1", BIG_CELL, "x += 1\nx"]


async def test_a_deleted_data_directory_is_detected_and_the_database_made_again(
    local_backend: LocalBackend, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    async with serve(local_settings(data_dir, on_shutdown="stop"), local_backend) as (app, http):
        store = gateway_state(app).store  # type: ignore[arg-type]
        sid = (await http.post("/v1/sessions", json={})).json()["id"]
        assert (await http.post(f"/v1/sessions/{sid}/execute", json={"code": "1"})).status_code == 200
        await store.flush()
        shutil.rmtree(data_dir)

        during = await http.post(f"/v1/sessions/{sid}/execute", json={"code": "'after the deletion'"})
        assert during.status_code in (200, 503), during.text

        async def recovered() -> bool:
            return store.health.last_fault is not None and store.health.ok and (data_dir / DB_FILE).exists()

        await wait_until(recovered, "the fault is seen and the database made again at its path")
        assert store.health.last_fault is not None and "deleted" in store.health.last_fault.error

        new = (await http.post("/v1/sessions", json={})).json()["id"]
        assert (await http.post(f"/v1/sessions/{new}/execute", json={"code": "'new'"})).status_code == 200
        await store.flush()
        rows = await asyncio.to_thread(_codes_on_disk, data_dir / DB_FILE)
        # written to the file at the path, not into the deleted one
        assert "'after the deletion'" in rows and "'new'" in rows and "1" not in rows


def _codes_on_disk(path: Path) -> list[str]:
    with sqlite3.connect(path) as conn:
        return [row[0] for row in conn.execute("SELECT code FROM kgw_executions")]


async def _not(check: object) -> bool:
    assert asyncio.iscoroutine(check)
    return not await check
