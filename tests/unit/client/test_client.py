"""The SDK's shared base (URLs, bodies, error parsing, stream protocol), and both
clients end to end over httpx.MockTransport: no gateway, no network."""

from __future__ import annotations

import json

import httpx
import pytest
from pydantic import ValidationError

from kernelgw import models
from kernelgw.client import (
    AsyncClient,
    AsyncSession,
    Client,
    Session,
    SessionInfo,
    error_from_close,
    error_from_response,
)
from kernelgw.client._stream import _StreamState
from kernelgw.errors import ClientError, KernelGWError

INFO = {
    "id": "abc123",
    "state": "idle",
    "image": "kernelgw/python:latest",
    "runtime": "runc",
    "memory_mb": 1024,
    "cpus": 1.0,
    "created_at": "2024-05-01T12:00:00Z",
    "last_activity": "2024-05-01T12:00:01+00:00",
    "execution_count": 0,
    "queue_length": 0,
}


# --------------------------------------------------------------------- URLs


@pytest.mark.parametrize(
    ("base", "ws"),
    [
        ("http://127.0.0.1:8000", "ws://127.0.0.1:8000/v1/sessions/s1/ws"),
        ("http://127.0.0.1:8000/", "ws://127.0.0.1:8000/v1/sessions/s1/ws"),
        ("https://gw.example.com", "wss://gw.example.com/v1/sessions/s1/ws"),
        ("https://gw.example.com/kgw/", "wss://gw.example.com/kgw/v1/sessions/s1/ws"),
    ],
)
def test_ws_url_from_http_and_https(base, ws):
    client = Client(base)
    try:
        assert client._ws_url("s1") == ws
        assert client._ws_url("s1", last_seq=17) == ws + "?last_seq=17"
    finally:
        client.close()


def test_http_urls_keep_a_path_prefix_and_quote_ids():
    with Client("https://gw.example.com/kgw/") as client:
        assert client.base_url == "https://gw.example.com/kgw"
        assert client._url("/healthz") == "https://gw.example.com/kgw/healthz"
        call = client._get_call("a/b?c")
        assert call.path == "/v1/sessions/a%2Fb%3Fc"
        assert client._ws_url("a/b").endswith("/v1/sessions/a%2Fb/ws")


@pytest.mark.parametrize("bad", ["ws://x:1", "127.0.0.1:8000", "ftp://x", "http://"])
def test_base_url_must_be_http(bad):
    with pytest.raises(ValueError):
        Client(bad)


# ---------------------------------------------------------------- bodies


def test_create_body_leaves_out_unset_options():
    with Client() as client:
        assert client._create_call(memory_mb=None, cpus=None, env=None, image=None, timeout=None).json == {}
        call = client._create_call(memory_mb=512, cpus=0.5, env={"A": "1"}, image="img", timeout=9)
        assert call.method == "POST" and call.path == "/v1/sessions"
        assert call.json == {"memory_mb": 512, "cpus": 0.5, "env": {"A": "1"}, "image": "img", "timeout": 9}
        assert call.timeout.read == client.start_timeout


def test_an_upload_waits_as_long_as_a_start():
    """A session's first file starts its workspace store, a container."""
    with Client(timeout=5) as client:
        session = Session(client, SessionInfo.model_validate(INFO))
        call = session._upload_call("data.csv", b"x", 1)
        assert call.timeout.connect == 5
        assert call.timeout.read == client.start_timeout


def test_execute_http_timeout_is_the_execution_timeout_plus_a_margin():
    with Client(timeout=5) as client:
        session = Session(client, SessionInfo.model_validate(INFO), default_timeout=20)
        call = session._execute_call("1", 10, None)
        assert call.json == {"code": "1", "timeout": 10}
        assert call.timeout.connect == 5
        assert 10 < call.timeout.read <= 10 + 600
        # The session's default timeout applies when the call names none.
        call = session._execute_call("1", None, "my-id")
        assert call.json == {"code": "1", "execution_id": "my-id"}
        assert 20 < call.timeout.read <= 20 + 600
        # Unknown (gateway default): the gateway enforces it, no read timeout here.
        session = Session(client, SessionInfo.model_validate(INFO))
        assert session._execute_call("1", None, None).timeout.read is None


def test_session_info_parses_and_tolerates_new_fields():
    info = SessionInfo.model_validate({**INFO, "something_new": 1})
    assert info.id == "abc123" and info.created_at.year == 2024 and info.memory_mb == 1024
    assert SessionInfo.model_validate({"id": "x", "state": "starting"}).queue_length == 0


def test_the_sdk_reads_the_gateways_own_models():
    assert SessionInfo is models.SessionInfo
    created = models.CreatedSession.model_validate(
        {**INFO, "replay": [{"index": 0, "status": "ok", "execution_count": 1, "added_later": True}]}
    )
    with Client() as client:
        replay = Session(client, created).replay
        assert replay is not None and replay[0].status == "ok"
        assert Session(client, SessionInfo.model_validate(INFO)).replay is None


# ---------------------------------------------------------- error parsing


def test_error_body_becomes_client_error():
    body = json.dumps({"error": {"code": "session_not_found", "message": "No session 'x'."}})
    err = error_from_response(404, body.encode())
    assert isinstance(err, ClientError) and isinstance(err, KernelGWError)
    assert (err.status_code, err.code, err.message) == (404, "session_not_found", "No session 'x'.")
    assert str(err) == "404 session_not_found: No session 'x'."


def test_fastapi_default_bodies_and_plain_text():
    err = error_from_response(404, b'{"detail": "Not Found"}')
    assert (err.status_code, err.code, err.message) == (404, "not_found", "Not Found")

    detail = [{"loc": ["body", "memory_mb"], "msg": "Input should be a valid integer"}]
    err = error_from_response(422, json.dumps({"detail": detail}))
    assert err.code == "validation_error"
    assert err.message == "body.memory_mb: Input should be a valid integer"

    err = error_from_response(502, b"<html>Bad Gateway</html>", "Bad Gateway")
    assert (err.code, err.message) == ("bad_gateway", "<html>Bad Gateway</html>")

    err = error_from_response(500, b"", "Internal Server Error")
    assert (err.code, err.message) == ("internal_error", "Internal Server Error")


def test_websocket_close_codes():
    err = error_from_close(4404, "No session 'x'.")
    assert (err.status_code, err.code, err.message) == (404, "session_not_found", "No session 'x'.")
    err = error_from_close(4409, json.dumps({"code": "session_busy", "message": "busy"}))
    assert (err.status_code, err.code, err.message) == (409, "session_busy", "busy")
    err = error_from_close(4404, "")
    assert "4404" in err.message


# ------------------------------------------------------- stream protocol


def frame(type_, seq, eid, **fields):
    return json.dumps({"type": type_, "seq": seq, "execution_id": eid, **fields})


def new_state(timeout=None):
    with Client("https://gw") as client:
        return _StreamState(client, "s1", "print(1)", timeout)


def test_stream_state_sends_execute_with_a_client_side_id():
    state = new_state(timeout=5)
    assert len(state.execution_id) == 32
    assert json.loads(state.hello()) == {
        "type": "execute",
        "code": "print(1)",
        "execution_id": state.execution_id,
        "timeout": 5,
    }
    assert state.url == "wss://gw/v1/sessions/s1/ws"
    assert "timeout" not in json.loads(new_state().hello())


def test_stream_state_filters_by_execution_id_and_stops_at_done():
    state = new_state()
    eid = state.execution_id
    assert state.feed(frame("stream", 1, "other", name="stdout", text="x")) is None
    assert state.feed(frame("queued", 2, eid, code="print(1)")).type == "queued"
    assert state.feed(frame("stream", 3, eid, name="stdout", text="1\n")).text == "1\n"
    assert not state.finished
    assert state.feed(frame("done", 4, eid, status="ok", duration_ms=1.0)).type == "done"
    assert state.finished


def test_stream_state_passes_over_event_types_newer_than_the_sdk():
    """A newer gateway may send event types this SDK does not know (say, a
    session-level event while a cell streams): they are skipped, their seq
    still counts for a resume, and the cell's own events go on."""
    state = new_state()
    eid = state.execution_id
    assert state.feed(frame("queued", 1, eid, code="c")).type == "queued"
    assert state.feed(frame("kernel_weather", 2, None, forecast="sunny")) is None
    assert state.feed(frame("kernel_weather", 3, eid)) is None
    assert state.last_seq == 3
    assert state.feed(frame("done", 4, eid, status="ok", duration_ms=1.0)).type == "done"
    with pytest.raises(ValidationError):
        state.feed("not json at all")  # malformed frames are still errors


def test_stream_state_resumes_without_resending_and_skips_replayed_events():
    state = new_state()
    eid = state.execution_id
    state.feed(frame("queued", 7, eid, code="c"))
    state.feed(frame("stream", 8, eid, name="stdout", text="a"))
    state.closed(1006, "")  # dropped: returns, so the caller reconnects
    assert state.hello() is None  # the gateway has the execution already
    assert state.url.endswith("/ws?last_seq=8")
    assert state.feed(frame("stream", 8, eid, name="stdout", text="a")) is None
    assert state.feed(frame("stream", 9, eid, name="stdout", text="b")).text == "b"


def test_stream_state_gives_up_when_the_execution_was_never_acknowledged():
    state = new_state()
    with pytest.raises(ClientError) as info:
        state.closed(1006, "")
    assert info.value.code == "connection_closed"


def test_stream_state_gives_up_after_some_resumes():
    state = new_state()
    state.feed(frame("queued", 1, state.execution_id, code="c"))
    with pytest.raises(ClientError):
        for _ in range(100):
            state.closed(1011, "server error")
    assert 0 < state.resumes < 100


def test_stream_state_4404_close_is_a_404():
    state = new_state()
    with pytest.raises(ClientError) as info:
        state.closed(4404, "no such session")
    assert info.value.status_code == 404


def test_stream_state_protocol_error_and_gap_raise():
    state = new_state()
    with pytest.raises(ClientError) as info:
        state.feed(json.dumps({"type": "protocol_error", "seq": 1, "message": "bad message"}))
    assert info.value.code == "protocol_error" and info.value.message == "bad message"
    with pytest.raises(ClientError) as info:
        state.feed(json.dumps({"type": "gap", "first_missing": 1, "last_missing": 5}))
    assert info.value.code == "events_lost"


# ------------------------------------------- clients over a mock transport


def gateway(request: httpx.Request) -> httpx.Response:
    """A tiny fake gateway for the REST routes."""
    path, method = request.url.path, request.method
    if path == "/healthz":
        return httpx.Response(200, json={"status": "ok"})
    if path == "/v1/sessions" and method == "POST":
        body = json.loads(request.content)
        return httpx.Response(201, json={**INFO, "memory_mb": body.get("memory_mb", 1024)})
    if path == "/v1/sessions" and method == "GET":
        return httpx.Response(200, json={"sessions": [INFO, {**INFO, "id": "def456"}]})
    if not path.startswith("/v1/sessions/abc123"):
        return httpx.Response(404, json={"error": {"code": "session_not_found", "message": "No session."}})
    rest = path.removeprefix("/v1/sessions/abc123")
    if rest == "" and method == "GET":
        return httpx.Response(200, json={**INFO, "execution_count": 5})
    if rest == "" and method == "DELETE":
        return httpx.Response(204)
    if rest == "/interrupt":
        return httpx.Response(202, json={"interrupted": True})
    if rest == "/restart":
        return httpx.Response(200, json={**INFO, "state": "idle", "execution_count": 0})
    if rest == "/execute":
        body = json.loads(request.content)
        eid = body.get("execution_id", "srv-id")
        events = [
            {"type": "stream", "seq": 1, "execution_id": eid, "name": "stdout", "text": "out\n"},
            {"type": "result", "seq": 2, "execution_id": eid, "data": {"text/plain": "42"}},
            {"type": "done", "seq": 3, "execution_id": eid, "status": "ok", "duration_ms": 3.0, "execution_count": 1},
        ]
        return httpx.Response(
            200,
            json={"execution_id": eid, "status": "ok", "execution_count": 1, "duration_ms": 3.0, "events": events},
        )
    return httpx.Response(405, json={"detail": "Method Not Allowed"})


def test_sync_client_over_mock_transport():
    calls = []

    def handler(request):
        calls.append((request.method, request.url.path))
        return gateway(request)

    with Client(transport=httpx.MockTransport(handler)) as client:
        assert client.health() == {"status": "ok"}
        with client.session(memory_mb=512, timeout=10) as session:
            assert isinstance(session, Session)
            assert session.id == "abc123" and session.last_info.memory_mb == 512
            assert session.default_timeout == 10
            ex = session.run("print('out'); 42", execution_id="mine")
            assert ex.execution_id == "mine" and ex.text == "42" and ex.stdout == "out\n"
            assert session.info().execution_count == 5
            assert session.interrupt() is True
            assert session.restart().execution_count == 0
        assert [s.id for s in client.list_sessions()] == ["abc123", "def456"]
        with pytest.raises(ClientError) as info:
            client.get_session("nope")
        assert info.value.status_code == 404 and info.value.code == "session_not_found"
    assert ("DELETE", "/v1/sessions/abc123") in calls


def test_session_context_manager_ignores_an_already_deleted_session():
    def handler(request):
        if request.method == "DELETE":
            return httpx.Response(404, json={"error": {"code": "session_not_found", "message": "x"}})
        return gateway(request)

    with Client(transport=httpx.MockTransport(handler)) as client:
        with client.session() as session:
            pass
        with pytest.raises(ClientError):
            session.delete()


async def test_async_client_over_mock_transport():
    async with AsyncClient(transport=httpx.MockTransport(gateway)) as client:
        assert (await client.health())["status"] == "ok"
        async with client.session() as session:
            assert isinstance(session, AsyncSession)
            ex = await session.run("42")
            assert ex.text == "42" and ex.ok
            assert (await session.info()).execution_count == 5
            assert await session.interrupt() is True
        sessions = await client.list_sessions()
        assert all(isinstance(s, AsyncSession) for s in sessions)
        with pytest.raises(ClientError) as info:
            await client.get_session("nope")
        assert info.value.status_code == 404


def test_stream_state_resumes_after_4008_too_slow():
    state = new_state()
    state.feed(frame("queued", 3, state.execution_id, code="c"))
    state.closed(4008, "client too slow; reconnect with last_seq to resume")
    assert state.url.endswith("?last_seq=3") and state.hello() is None


def test_health_returns_a_degraded_report_and_rejects_other_503s():
    def degraded(request):
        return httpx.Response(503, json={"status": "degraded", "engine": False})

    with Client(transport=httpx.MockTransport(degraded)) as client:
        assert client.health()["status"] == "degraded"

    def proxy(request):
        return httpx.Response(503, text="Service Unavailable")

    with Client(transport=httpx.MockTransport(proxy)) as client:
        with pytest.raises(ClientError) as info:
            client.health()
        assert info.value.status_code == 503
