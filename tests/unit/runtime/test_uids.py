"""Choosing a session's host uid (`kernelgw.runtime.backends.uids`): the pure
logic, and the reservations two gateways share through one directory (the
engine's containers stood for by a dict here; tests/security/test_tenant_limits.py
runs it against the real engine)."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from kernelgw.config import Settings, parse_uid_range
from kernelgw.errors import KernelStartFailed, UidsExhausted
from kernelgw.runtime.backends.base import KernelHandle, KernelSpec
from kernelgw.runtime.backends.uids import RESERVATIONS_FILE, UidAllocator, choose_uid
from kernelgw.server import create_app
from tests.unit.server.test_api import EngineDown


def test_range_is_start_dash_end_both_included() -> None:
    assert parse_uid_range("200000-265535") == range(200000, 265536)
    assert parse_uid_range(" 70000-70000 ") == range(70000, 70001)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("200000", "START-END"),
        ("a-b", "whole numbers"),
        ("500-2000", "1000 or above"),
        ("3000-2000", "ends before it starts"),
        ("3000-4294967295", "at or below"),
    ],
)
def test_bad_ranges_are_refused_saying_why(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_uid_range(text)
    with pytest.raises(ValidationError, match="kernel_uid_range"):
        Settings(kernel_uid_range=text)


def test_empty_range_means_one_shared_uid() -> None:
    assert Settings(kernel_uid_range="").kernel_uid_range == ""


def test_choose_keeps_the_owners_uid_then_prefers_then_takes_the_lowest_free() -> None:
    uids = range(5000, 5004)
    assert choose_uid(uids, {5000: "gw/a"}, "gw/b") == 5001
    assert choose_uid(uids, {5000: "gw/a", 5002: "gw/b"}, "gw/b", prefer=5003) == 5002  # its own, still held
    assert choose_uid(uids, {5000: "gw/a"}, "gw/b", prefer=5003) == 5003
    assert choose_uid(uids, {5000: "gw/a"}, "gw/b", prefer=5000) == 5001  # another's: not taken
    assert choose_uid(uids, {}, "gw/b", prefer=99) == 5000  # outside the range: ignored


def test_exhausted_range_is_a_503_naming_the_setting() -> None:
    with pytest.raises(UidsExhausted) as caught:
        choose_uid(range(5000, 5002), {5000: "gw/a", 5001: "other/b"}, "gw/c")
    assert caught.value.status_code == 503 and caught.value.code == "kernel_uids_exhausted"
    assert "kernel_uid_range" in str(caught.value) and "5000-5001" in str(caught.value)


def test_two_gateways_never_choose_the_same_uid_before_its_container_exists(tmp_path: Path) -> None:
    engine: dict[int, str] = {}
    one = UidAllocator(range(5000, 5003), tmp_path, lambda: dict(engine))
    two = UidAllocator(range(5000, 5003), tmp_path, lambda: dict(engine))
    a = one.acquire("one/a")
    b = two.acquire("two/b")  # one/a has no container yet: its reservation holds the uid
    assert (a, b) == (5000, 5001)
    engine[a] = "one/a"  # its container now carries the label
    one.release("one/a")
    assert one.acquire("one/a") == a  # asked again (a restart): the same uid
    one.release("one/a")
    del engine[a]  # all its containers gone: free for anyone
    assert two.acquire("two/c") == a


def test_expired_reservation_is_free_again(tmp_path: Path) -> None:
    allocator = UidAllocator(range(5000, 5001), tmp_path, dict)
    (tmp_path / RESERVATIONS_FILE).write_text(json.dumps({"5000": ["dead/x", time.time() - 1]}))
    assert allocator.acquire("gw/a") == 5000
    with pytest.raises(UidsExhausted):
        allocator.acquire("gw/b")


class NoUidLeft(EngineDown):
    async def start(self, spec: KernelSpec) -> KernelHandle:
        return choose_uid(range(5000, 5001), {5000: "gw/other"}, spec.session_id)  # type: ignore[return-value]


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(Settings(data_dir=tmp_path, pool_size=0), backend=NoUidLeft())
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
            yield c


async def test_create_with_no_uid_left_is_503_saying_which_setting(client: httpx.AsyncClient) -> None:
    resp = await client.post("/v1/sessions", json={})
    assert resp.status_code == 503 and int(resp.headers["Retry-After"]) > 0
    error = resp.json()["error"]
    assert error["code"] == "kernel_uids_exhausted" and "kernel_uid_range" in error["message"], error


def test_unusable_state_dir_is_a_start_failure_naming_the_setting(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    with pytest.raises(KernelStartFailed, match="uid_state_dir"):
        UidAllocator(range(5000, 5001), blocked / "uids", dict).acquire("gw/a")
