"""Python SDK for a kernelgw gateway: `Client` (sync) and `AsyncClient`.

    with Client("http://127.0.0.1:8000") as client:
        with client.session() as session:
            session.run("x = 41")
            print(session.run("x + 1").text)            # 42
            for event in session.stream("print('hi')"):
                ...

The two clients are thin shells. `_BaseClient` and `_SessionBase` build every
request and parse every answer (`_Call`), and `_StreamState` runs the WebSocket
protocol of one streamed execution; the shells only move bytes, with httpx and
websockets' sync or asyncio client.

Errors: an error answer from the gateway raises `kernelgw.errors.ClientError`
(``status_code``, ``code``, ``message``); a WebSocket closed with code ``4xxx``
raises it with status ``xxx``. Network failures surface as httpx / OSError
exceptions.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, NoReturn, TypeVar
from urllib.parse import quote, urlencode, urlsplit, urlunsplit

import httpx
from pydantic import BaseModel, ConfigDict
from websockets.asyncio.client import connect as _aconnect
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect as _connect

from .errors import ClientError
from .events import Done, Event, Gap, ProtocolError, parse_event
from .execution import Execution

__all__ = [
    "AsyncClient",
    "AsyncSession",
    "Client",
    "Session",
    "SessionInfo",
    "DEFAULT_URL",
]

DEFAULT_URL = "http://127.0.0.1:8000"
DEFAULT_TIMEOUT = 30.0
"""Seconds for ordinary requests."""
START_TIMEOUT = 120.0
"""Seconds for requests that start a kernel (create, restart)."""
EXECUTE_MARGIN = 90.0
"""Added to an execution's timeout for the HTTP read timeout of ``/execute``: a
timed-out kernel gets an interrupt grace period and may be restarted before the
gateway answers."""
MAX_RESUMES = 3
"""How often a stream reconnects (with ``last_seq``) after the connection drops."""
RESUMABLE_CLOSE_CODES = frozenset({4008})
"""Close codes after which a stream reconnects: 4008 = the client fell behind."""

T = TypeVar("T")
C = TypeVar("C", bound="_BaseClient")


class SessionInfo(BaseModel):
    """A session as the gateway describes it. Unknown fields are ignored."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    id: str
    state: str
    """``starting``, ``idle``, ``busy`` or ``dead``."""
    image: str | None = None
    runtime: str | None = None
    memory_mb: int | None = None
    cpus: float | None = None
    created_at: datetime | None = None
    last_activity: datetime | None = None
    execution_count: int = 0
    queue_length: int = 0
    last_seq: int | None = None
    """The session's latest event sequence number."""
    dead_reason: str | None = None
    """Why the kernel died, when ``state`` is ``dead``."""


# ----------------------------------------------------------------- pure helpers


def _normalize_base_url(base_url: str) -> str:
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"base_url must be an http:// or https:// URL, not {base_url!r}")
    return urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))


def _session_path(session_id: str, suffix: str = "") -> str:
    return f"/v1/sessions/{quote(session_id, safe='')}{suffix}"


def _error_code_for(status_code: int) -> str:
    return {
        400: "bad_request",
        404: "not_found",
        405: "method_not_allowed",
        409: "conflict",
        422: "validation_error",
        429: "too_many_requests",
        500: "internal_error",
        502: "bad_gateway",
        503: "unavailable",
    }.get(status_code, f"http_{status_code}")


def error_from_response(status_code: int, content: bytes | str, reason: str = "") -> ClientError:
    """The `ClientError` for an error answer.

    Understands kernelgw's ``{"error": {"code", "message"}}``, FastAPI's default
    ``{"detail": ...}`` (unknown route, validation error) and plain text.
    """
    text = content.decode("utf-8", "replace") if isinstance(content, bytes) else content
    code, message = _error_code_for(status_code), ""
    try:
        body = json.loads(text) if text else None
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        code = str(body["error"].get("code") or code)
        message = str(body["error"].get("message") or "")
    elif isinstance(body, dict) and "detail" in body:
        detail = body["detail"]
        if isinstance(detail, list):  # pydantic validation errors
            message = "; ".join(
                f"{'.'.join(str(p) for p in d.get('loc', ()))}: {d.get('msg', '')}"
                if isinstance(d, dict)
                else str(d)
                for d in detail
            )
        else:
            message = str(detail)
    elif text and body is None:
        message = text.strip()[:500]
    return ClientError(status_code, code, message or reason or "request failed")


def error_from_close(code: int | None, reason: str) -> ClientError:
    """The `ClientError` for a WebSocket closed by the gateway with ``4xxx``.

    ``4404`` means HTTP 404 and so on; a JSON reason ``{"code", "message"}`` is
    understood, any other reason is the message.
    """
    assert code is not None and 4000 <= code < 5000
    status = code - 4000
    err_code = "session_not_found" if status == 404 else _error_code_for(status)
    message = reason
    with contextlib.suppress(ValueError):
        body = json.loads(reason)
        if isinstance(body, dict):
            body = body.get("error", body)
            if isinstance(body, dict):
                err_code = str(body.get("code") or err_code)
                message = str(body.get("message") or "")
    return ClientError(status, err_code, message or f"WebSocket closed with code {code}")


@dataclass(frozen=True)
class _Call(Generic[T]):
    """One HTTP request and how to read its answer; the client only sends it."""

    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    json: Any = None
    timeout: Any = httpx.USE_CLIENT_DEFAULT
    allow: frozenset[int] = field(default_factory=frozenset)
    """Non-2xx statuses passed to ``parse`` instead of raising."""

    def finish(self, response: httpx.Response) -> T:
        if response.is_success or response.status_code in self.allow:
            return self.parse(response)
        raise error_from_response(response.status_code, response.content, response.reason_phrase)


def _no_content(response: httpx.Response) -> None:
    return None


def _health_report(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and "status" in body:
        return body
    raise error_from_response(response.status_code, response.content, response.reason_phrase)


# ------------------------------------------------------------ shared base: client


class _BaseClient:
    """What `Client` and `AsyncClient` share: URLs, request bodies, parsing."""

    _session_cls: type[_SessionBase[Any]]

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float | None,
        start_timeout: float | None,
        headers: Mapping[str, str] | None,
    ) -> None:
        self.base_url = _normalize_base_url(base_url)
        self.timeout = timeout
        self.start_timeout = start_timeout
        self.headers = dict(headers or {})

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.base_url!r})"

    # --- URLs

    def _url(self, path: str) -> str:
        return self.base_url + path

    def _ws_url(self, session_id: str, last_seq: int | None = None) -> str:
        """``ws://`` for an ``http://`` gateway, ``wss://`` for ``https://``."""
        parts = urlsplit(self.base_url)
        scheme = "wss" if parts.scheme == "https" else "ws"
        query = urlencode({"last_seq": last_seq}) if last_seq is not None else ""
        path = parts.path + _session_path(session_id, "/ws")
        return urlunsplit((scheme, parts.netloc, path, query, ""))

    def _start_timeout(self) -> httpx.Timeout:
        return httpx.Timeout(self.timeout, read=self.start_timeout)

    def _execute_timeout(self, exec_timeout: float | None) -> httpx.Timeout:
        """HTTP timeout for a blocking execute: the execution's plus a margin.

        When neither the call nor the session named a timeout, the gateway's
        default applies and is unknown here; the gateway enforces it, so the read
        does not time out on this side.
        """
        read = exec_timeout + EXECUTE_MARGIN if exec_timeout is not None else None
        return httpx.Timeout(self.timeout, read=read)

    # --- calls

    def _session(self, info: SessionInfo, default_timeout: float | None = None) -> Any:
        return self._session_cls(self, info, default_timeout)

    def _create_call(
        self,
        *,
        memory_mb: int | None,
        cpus: float | None,
        env: Mapping[str, str] | None,
        image: str | None,
        timeout: float | None,
    ) -> _Call[Any]:
        body = {
            k: v
            for k, v in {
                "memory_mb": memory_mb,
                "cpus": cpus,
                "env": dict(env) if env is not None else None,
                "image": image,
                "timeout": timeout,
            }.items()
            if v is not None
        }
        return _Call(
            "POST",
            "/v1/sessions",
            lambda r: self._session(SessionInfo.model_validate(r.json()), timeout),
            json=body,
            timeout=self._start_timeout(),
        )

    def _get_call(self, session_id: str) -> _Call[Any]:
        return _Call(
            "GET",
            _session_path(session_id),
            lambda r: self._session(SessionInfo.model_validate(r.json())),
        )

    def _list_call(self) -> _Call[list[Any]]:
        return _Call(
            "GET",
            "/v1/sessions",
            lambda r: [self._session(SessionInfo.model_validate(s)) for s in r.json()["sessions"]],
        )

    def _health_call(self) -> _Call[dict[str, Any]]:
        # A degraded gateway answers 503 with its health report: return it.
        return _Call("GET", "/healthz", _health_report, allow=frozenset({503}))


# ----------------------------------------------------------- shared base: session


class _SessionBase(Generic[C]):
    """What `Session` and `AsyncSession` share."""

    def __init__(self, client: C, info: SessionInfo, default_timeout: float | None = None):
        self._client = client
        self.id = info.id
        self.last_info = info
        """The session as last reported by the gateway (see ``info()``)."""
        self.default_timeout = default_timeout
        """The per-execution timeout the session was created with, if known."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(id={self.id!r}, state={self.last_info.state!r})"

    def _info_call(self) -> _Call[SessionInfo]:
        return _Call("GET", _session_path(self.id), self._update_info)

    def _update_info(self, response: httpx.Response) -> SessionInfo:
        self.last_info = SessionInfo.model_validate(response.json())
        return self.last_info

    def _execute_call(
        self, code: str, timeout: float | None, execution_id: str | None
    ) -> _Call[Execution]:
        body: dict[str, Any] = {"code": code}
        if timeout is not None:
            body["timeout"] = timeout
        if execution_id is not None:
            body["execution_id"] = execution_id
        effective = timeout if timeout is not None else self.default_timeout
        return _Call(
            "POST",
            _session_path(self.id, "/execute"),
            lambda r: Execution.from_response(r.json()),
            json=body,
            timeout=self._client._execute_timeout(effective),
        )

    def _interrupt_call(self) -> _Call[bool]:
        return _Call(
            "POST",
            _session_path(self.id, "/interrupt"),
            lambda r: bool(r.json().get("interrupted", True)),
        )

    def _restart_call(self) -> _Call[SessionInfo]:
        return _Call(
            "POST",
            _session_path(self.id, "/restart"),
            self._update_info,
            timeout=self._client._start_timeout(),
        )

    def _delete_call(self, missing_ok: bool = False) -> _Call[None]:
        allow = frozenset({404}) if missing_ok else frozenset()
        return _Call("DELETE", _session_path(self.id), _no_content, allow=allow)

    def _stream_state(self, code: str, timeout: float | None) -> _StreamState:
        return _StreamState(self._client, self.id, code, timeout)


class _StreamState:
    """The WebSocket protocol of one streamed execution, without the I/O.

    The shell loop is: connect to `url`; send `hello()` if not None; `feed` every
    frame and yield what it returns until `finished`. When the connection closes
    early, `closed` either raises or returns, and the loop reconnects: the
    execution keeps running on the gateway, and ``last_seq`` replays what was
    missed. The execute message is sent only until the gateway acknowledges it
    with an event, so a reconnect never runs the code twice.
    """

    def __init__(
        self, client: _BaseClient, session_id: str, code: str, timeout: float | None
    ) -> None:
        self._client = client
        self.session_id = session_id
        self.execution_id = uuid.uuid4().hex
        message: dict[str, Any] = {
            "type": "execute",
            "code": code,
            "execution_id": self.execution_id,
        }
        if timeout is not None:
            message["timeout"] = timeout
        self._message = json.dumps(message)
        self.last_seq: int | None = None
        self.accepted = False
        self.finished = False
        self.resumes = 0

    @property
    def url(self) -> str:
        return self._client._ws_url(self.session_id, self.last_seq if self.accepted else None)

    def connect_options(self) -> dict[str, Any]:
        return {
            "additional_headers": self._client.headers or None,
            "open_timeout": self._client.timeout,
            "max_size": None,  # images can be large; the gateway caps output
        }

    def hello(self) -> str | None:
        return None if self.accepted else self._message

    def feed(self, frame: str | bytes) -> Event | None:
        """Parse one frame; return the event if it belongs to this execution."""
        event = parse_event(frame)
        if event.seq is not None:
            if self.last_seq is not None and event.seq <= self.last_seq:
                return None  # replayed after a reconnect, already seen
            self.last_seq = event.seq
        if isinstance(event, ProtocolError) and event.execution_id in (None, self.execution_id):
            raise ClientError(400, "protocol_error", event.message)
        if isinstance(event, Gap):
            raise ClientError(
                502,
                "events_lost",
                f"events {event.first_missing}..{event.last_missing} of execution "
                f"{self.execution_id} are no longer available after a reconnect",
            )
        if event.execution_id != self.execution_id:
            return None
        self.accepted = True
        if isinstance(event, Done):
            self.finished = True
        return event

    def closed(self, code: int | None, reason: str) -> None:
        """The connection ended before ``done``: raise, or return to reconnect.

        ``4xxx`` codes are the gateway's errors (``4404``: no such session),
        except ``4008``: this client fell behind and may resume.
        """
        if code is not None and 4000 <= code < 5000 and code not in RESUMABLE_CLOSE_CODES:
            raise error_from_close(code, reason)
        if self.accepted and self.last_seq is not None and self.resumes < MAX_RESUMES:
            self.resumes += 1
            return
        raise ClientError(
            502,
            "connection_closed",
            f"the WebSocket closed (code {code}{': ' + reason if reason else ''}) "
            f"before execution {self.execution_id} finished",
        )

    def connection_closed(self, exc: ConnectionClosed) -> None:
        frame = exc.rcvd
        self.closed(frame.code if frame is not None else 1006, frame.reason if frame else "")

    @staticmethod
    def rejected(exc: InvalidStatus) -> NoReturn:
        """The gateway refused the WebSocket handshake with an HTTP answer."""
        response = exc.response
        raise error_from_response(response.status_code, response.body or b"", response.reason_phrase)


# ------------------------------------------------------------------------- sync


class Session(_SessionBase["Client"]):
    """A kernel on the gateway. Get one from `Client.create_session` / `.session()`.

    Used as a context manager, it is deleted on exit.
    """

    def info(self) -> SessionInfo:
        return self._client._send(self._info_call())

    def run(
        self, code: str, *, timeout: float | None = None, execution_id: str | None = None
    ) -> Execution:
        """Run ``code`` and wait for it; errors in the code do not raise (see
        `Execution.raise_for_error`)."""
        return self._client._send(self._execute_call(code, timeout, execution_id))

    def stream(self, code: str, *, timeout: float | None = None) -> Iterator[Event]:
        """Run ``code``, yielding its events live; the last one is ``done``."""
        state = self._stream_state(code, timeout)
        while not state.finished:
            try:
                with _connect(state.url, **state.connect_options()) as ws:
                    if (hello := state.hello()) is not None:
                        ws.send(hello)
                    while not state.finished:
                        if (event := state.feed(ws.recv())) is not None:
                            yield event
            except ConnectionClosed as exc:
                state.connection_closed(exc)
            except InvalidStatus as exc:
                state.rejected(exc)

    def interrupt(self) -> bool:
        """Interrupt the running execution (like Ctrl-C); True if one was running."""
        return self._client._send(self._interrupt_call())

    def restart(self) -> SessionInfo:
        """Restart the kernel: its variables are lost, the session id stays."""
        return self._client._send(self._restart_call())

    def delete(self, *, missing_ok: bool = False) -> None:
        self._client._send(self._delete_call(missing_ok))

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.delete(missing_ok=True)


class Client(_BaseClient):
    """Synchronous client of a kernelgw gateway.

    ``timeout`` applies to ordinary requests, ``start_timeout`` to those that
    start a kernel; executions get their own timeout plus a margin. ``transport``
    is passed to httpx (e.g. ``httpx.MockTransport`` in tests).
    """

    _session_cls = Session

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        *,
        timeout: float | None = DEFAULT_TIMEOUT,
        start_timeout: float | None = START_TIMEOUT,
        headers: Mapping[str, str] | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        super().__init__(base_url, timeout=timeout, start_timeout=start_timeout, headers=headers)
        self._http = httpx.Client(timeout=timeout, headers=self.headers, transport=transport)

    def _send(self, call: _Call[T]) -> T:
        response = self._http.request(
            call.method, self._url(call.path), json=call.json, timeout=call.timeout
        )
        return call.finish(response)

    def create_session(
        self,
        *,
        memory_mb: int | None = None,
        cpus: float | None = None,
        env: Mapping[str, str] | None = None,
        image: str | None = None,
        timeout: float | None = None,
    ) -> Session:
        """Start a kernel. ``timeout`` is the session's default per-execution timeout."""
        return self._send(
            self._create_call(memory_mb=memory_mb, cpus=cpus, env=env, image=image, timeout=timeout)
        )

    @contextlib.contextmanager
    def session(
        self,
        *,
        memory_mb: int | None = None,
        cpus: float | None = None,
        env: Mapping[str, str] | None = None,
        image: str | None = None,
        timeout: float | None = None,
    ) -> Iterator[Session]:
        """A new session, deleted when the ``with`` block ends."""
        with self.create_session(
            memory_mb=memory_mb, cpus=cpus, env=env, image=image, timeout=timeout
        ) as session:
            yield session

    def get_session(self, session_id: str) -> Session:
        return self._send(self._get_call(session_id))

    def list_sessions(self) -> list[Session]:
        return self._send(self._list_call())

    def health(self) -> dict[str, Any]:
        return self._send(self._health_call())

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


# ------------------------------------------------------------------------ async


class AsyncSession(_SessionBase["AsyncClient"]):
    """`Session` for `AsyncClient`: the same methods, awaited."""

    async def info(self) -> SessionInfo:
        return await self._client._send(self._info_call())

    async def run(
        self, code: str, *, timeout: float | None = None, execution_id: str | None = None
    ) -> Execution:
        return await self._client._send(self._execute_call(code, timeout, execution_id))

    async def stream(self, code: str, *, timeout: float | None = None) -> AsyncIterator[Event]:
        state = self._stream_state(code, timeout)
        while not state.finished:
            try:
                async with _aconnect(state.url, **state.connect_options()) as ws:
                    if (hello := state.hello()) is not None:
                        await ws.send(hello)
                    while not state.finished:
                        if (event := state.feed(await ws.recv())) is not None:
                            yield event
            except ConnectionClosed as exc:
                state.connection_closed(exc)
            except InvalidStatus as exc:
                state.rejected(exc)

    async def interrupt(self) -> bool:
        return await self._client._send(self._interrupt_call())

    async def restart(self) -> SessionInfo:
        return await self._client._send(self._restart_call())

    async def delete(self, *, missing_ok: bool = False) -> None:
        await self._client._send(self._delete_call(missing_ok))

    async def __aenter__(self) -> AsyncSession:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.delete(missing_ok=True)


class AsyncClient(_BaseClient):
    """Asynchronous client of a kernelgw gateway; see `Client`."""

    _session_cls = AsyncSession

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        *,
        timeout: float | None = DEFAULT_TIMEOUT,
        start_timeout: float | None = START_TIMEOUT,
        headers: Mapping[str, str] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        super().__init__(base_url, timeout=timeout, start_timeout=start_timeout, headers=headers)
        self._http = httpx.AsyncClient(timeout=timeout, headers=self.headers, transport=transport)

    async def _send(self, call: _Call[T]) -> T:
        response = await self._http.request(
            call.method, self._url(call.path), json=call.json, timeout=call.timeout
        )
        return call.finish(response)

    async def create_session(
        self,
        *,
        memory_mb: int | None = None,
        cpus: float | None = None,
        env: Mapping[str, str] | None = None,
        image: str | None = None,
        timeout: float | None = None,
    ) -> AsyncSession:
        return await self._send(
            self._create_call(memory_mb=memory_mb, cpus=cpus, env=env, image=image, timeout=timeout)
        )

    @contextlib.asynccontextmanager
    async def session(
        self,
        *,
        memory_mb: int | None = None,
        cpus: float | None = None,
        env: Mapping[str, str] | None = None,
        image: str | None = None,
        timeout: float | None = None,
    ) -> AsyncIterator[AsyncSession]:
        async with await self.create_session(
            memory_mb=memory_mb, cpus=cpus, env=env, image=image, timeout=timeout
        ) as session:
            yield session

    async def get_session(self, session_id: str) -> AsyncSession:
        return await self._send(self._get_call(session_id))

    async def list_sessions(self) -> list[AsyncSession]:
        return await self._send(self._list_call())

    async def health(self) -> dict[str, Any]:
        return await self._send(self._health_call())

    async def close(self) -> None:
        await self._http.aclose()

    aclose = close

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
