"""Pure parts of the security layer: key format, principals, rate limits, origins,
body caps, audit time parsing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import click
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from kernelgw.cli.admin import parse_when
from kernelgw.config import Settings
from kernelgw.errors import Unauthorized
from kernelgw.keys import (
    ANONYMOUS,
    ApiKey,
    KeyQuotas,
    Principal,
    bearer,
    format_key,
    hash_secret,
    new_key_id,
    new_secret,
    parse_key,
)
from kernelgw.server.auth import is_loopback
from kernelgw.server.limits import BodySizeLimit
from kernelgw.server.ratelimit import ExecutionRateLimiter


def test_a_new_key_parses_back_to_its_id_and_secret() -> None:
    key_id, secret = new_key_id(), new_secret()
    text = format_key(key_id, secret)
    assert text.startswith("kgw_") and len(secret) == 43
    assert parse_key(text) == (key_id, secret)
    assert parse_key(f"  {text}\n") == (key_id, secret)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "kgw_",
        "kgw_abc_def",
        "xyz_" + "a" * 12 + "_" + "b" * 43,
        "kgw_" + "A" * 12 + "_" + "b" * 43,
        "kgw_" + "a" * 12 + "_" + "b" * 42,
        "kgw_" + "a" * 12 + "_" + "b" * 43 + "x",
        "kgw_" + "a" * 12 + "_" + "b/" * 21 + "c",
    ],
)
def test_malformed_keys_do_not_parse(text: str) -> None:
    assert parse_key(text) is None


def test_keys_match_only_their_own_secret() -> None:
    secret = new_secret()
    key = ApiKey("abcdefabcdef", "n", "user", hash_secret(secret), datetime.now(UTC))
    assert key.matches(secret)
    assert not key.matches(new_secret())
    assert key.secret_sha256 != secret and len(key.secret_sha256) == 64


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, None),
        ("", None),
        ("Bearer", None),
        ("Bearer   ", None),
        ("Basic abc", None),
        ("Bearer abc", "abc"),
        ("bearer  abc ", "abc"),
    ],
)
def test_bearer_header(header: str | None, expected: str | None) -> None:
    assert bearer(header) == expected


def test_principals_see_their_own_sessions_and_admins_see_all() -> None:
    alice = Principal("a" * 12, "alice", "user")
    admin = Principal("b" * 12, "ops", "admin")
    assert alice.can_see("a" * 12) and not alice.can_see("c" * 12) and not alice.can_see(None)
    assert admin.can_see("c" * 12) and admin.can_see(None)
    assert ANONYMOUS.is_admin and ANONYMOUS.key_id is None


def test_quotas_round_trip_and_ignore_unknown_fields() -> None:
    q = KeyQuotas(max_sessions=2, executions_per_minute=10)
    assert q.to_dict() == {"max_sessions": 2, "executions_per_minute": 10}
    assert KeyQuotas.from_dict({**q.to_dict(), "future_field": 1}) == q


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_rate_limiter_allows_a_burst_then_the_steady_rate() -> None:
    clock = FakeClock()
    limiter = ExecutionRateLimiter(clock)
    assert [limiter.acquire("k", 6) for _ in range(6)] == [0.0] * 6
    wait = limiter.acquire("k", 6)
    assert wait == pytest.approx(10.0)  # 6/min: one token every 10 s
    clock.now += 5
    assert limiter.acquire("k", 6) == pytest.approx(5.0)
    clock.now += 5
    assert limiter.acquire("k", 6) == 0.0
    assert limiter.acquire("other", 6) == 0.0  # buckets are per key


def test_rate_limiter_memory_is_bounded() -> None:
    limiter = ExecutionRateLimiter(FakeClock(), max_keys=10)
    for i in range(100):
        limiter.acquire(f"k{i}", 1)
    assert len(limiter._buckets) <= 10


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.1", False),
        ("example.com", False),
    ],
)
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_parse_when_accepts_durations_and_iso_times() -> None:
    now = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
    assert parse_when("30m", now) == now - timedelta(minutes=30)
    assert parse_when("2h", now) == now - timedelta(hours=2)
    assert parse_when("1.5d", now) == now - timedelta(days=1.5)
    assert parse_when("2026-11-20T08:00", now) == datetime(2026, 11, 20, 8, 0, tzinfo=UTC)
    assert parse_when("2026-11-20T08:00+01:00", now).utcoffset() == timedelta(hours=1)
    with pytest.raises(click.BadParameter):
        parse_when("yesterday", now)


def _echo_app(limit: int) -> Starlette:
    async def echo(request: Request) -> JSONResponse:
        return JSONResponse({"size": len(await request.body())})

    app = Starlette(
        routes=[Route("/v1/x", echo, methods=["POST"]), Route("/v1/sessions/s/files/a", echo, methods=["PUT"])]
    )
    app.state.settings = Settings(max_request_bytes=limit)
    app.add_middleware(BodySizeLimit)
    return app


def test_body_cap_by_content_length_and_by_streamed_bytes() -> None:
    with TestClient(_echo_app(100)) as c:
        assert c.post("/v1/x", content=b"a" * 100).json() == {"size": 100}
        resp = c.post("/v1/x", content=b"a" * 101)
        assert resp.status_code == 413
        assert resp.json()["error"]["code"] == "payload_too_large"
        # no Content-Length (chunked): counted while read
        resp = c.post("/v1/x", content=iter([b"a" * 60, b"b" * 60]))
        assert resp.status_code == 413
        # uploads have their own limit and stream to the container
        assert c.put("/v1/sessions/s/files/a", content=b"a" * 500).json() == {"size": 500}


def test_websocket_frame_limit_follows_the_code_limit() -> None:
    assert Settings(max_code_bytes=1000).ws_max_message_bytes == 1000 + 64 * 1024
    assert Settings(max_ws_message_bytes=5000).ws_max_message_bytes == 5000


def test_replicas_with_one_token_secret_accept_each_others_tokens() -> None:
    import asyncio

    from kernelgw.server.auth import Authenticator

    async def main() -> None:
        settings = Settings(token_secret="shared", auth="off")
        a, b = Authenticator(settings, store=None), Authenticator(settings, store=None)  # type: ignore[arg-type]
        other = Authenticator(Settings(auth="off"), store=None)  # type: ignore[arg-type]
        token, _ = a.issue_token(Principal("k" * 12, "n", "user"))
        assert b.token_key_id(token) == "k" * 12
        with pytest.raises(Unauthorized):
            other.token_key_id(token)
        assert a.issue_token(ANONYMOUS)[0] != a.issue_token(ANONYMOUS)[0]  # a nonce in every token

    asyncio.run(main())
