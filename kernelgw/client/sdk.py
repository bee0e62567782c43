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

import asyncio
import contextlib
import json
import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, NoReturn, TypeVar, Union
from urllib.parse import quote, urlencode, urlsplit, urlunsplit

import httpx
from websockets.asyncio.client import connect as _aconnect
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect as _connect

from kernelgw.client.execution import Execution
from kernelgw.errors import ClientError
from kernelgw.events import Done, Event, Gap, ProtocolError, parse_event
from kernelgw.models import (
    CreatedSession,
    FileEntry,
    FileList,
    ImageList,
    InstallResult,
    ReplayedCell,
    SessionInfo,
    UploadResult,
)

__all__ = [
    "DEFAULT_URL",
    "AsyncClient",
    "AsyncSession",
    "Client",
    "ReplayedCell",
    "Session",
    "SessionInfo",
]

DEFAULT_URL = "http://127.0.0.1:8000"
API_KEY_ENV = "KERNELGW_API_KEY"
"""Where `Client` and `AsyncClient` find an API key when none is passed."""
DEFAULT_TIMEOUT = 30.0
"""Seconds for ordinary requests."""
START_TIMEOUT = 120.0
"""Seconds for requests that start a kernel (create, restart)."""
INSTALL_TIMEOUT = 900.0
"""Read timeout of a package install (resolving, downloading, installing)."""
FILE_CHUNK = 1 << 20
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


# --- history, notebooks and restore


NotebookSource = Union[Mapping[str, Any], str, "os.PathLike[str]"]
"""A notebook as decoded JSON, or the path of an .ipynb file."""


def _notebook_json(notebook: NotebookSource) -> dict[str, Any]:
    if isinstance(notebook, Mapping):
        return dict(notebook)
    data = json.loads(Path(notebook).read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError(f"{notebook} does not hold a notebook (a JSON object)")
    return data


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
                f"{'.'.join(str(p) for p in d.get('loc', ()))}: {d.get('msg', '')}" if isinstance(d, dict) else str(d)
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
    content: Any = None
    """A raw request body (bytes, a file, or an (async) iterator of bytes) instead of ``json``."""
    params: Any = None
    headers: Any = None

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
        api_key: str | None = None,
    ) -> None:
        self.base_url = _normalize_base_url(base_url)
        self.timeout = timeout
        self.start_timeout = start_timeout
        self.headers = dict(headers or {})
        key = api_key if api_key is not None else os.environ.get(API_KEY_ENV)
        if key:
            # on every request and on the WebSocket handshake
            self.headers["Authorization"] = f"Bearer {key}"

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
        notebook: NotebookSource | None = None,
        from_session: str | None = None,
    ) -> _Call[Any]:
        body = {
            k: v
            for k, v in {
                "memory_mb": memory_mb,
                "cpus": cpus,
                "env": dict(env) if env is not None else None,
                "image": image,
                "timeout": timeout,
                "notebook": _notebook_json(notebook) if notebook is not None else None,
                "from_session": from_session,
            }.items()
            if v is not None
        }
        restoring = notebook is not None or from_session is not None
        return _Call(
            "POST",
            "/v1/sessions",
            lambda r: self._session(CreatedSession.model_validate(r.json()), timeout),
            json=body,
            # a restore answers after replaying every cell: no read timeout here
            timeout=httpx.Timeout(self.timeout, read=None) if restoring else self._start_timeout(),
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

    def _images_call(self) -> _Call[ImageList]:
        return _Call("GET", "/v1/images", lambda r: ImageList.model_validate(r.json()))

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
        self.replay: list[ReplayedCell] | None = info.replay if isinstance(info, CreatedSession) else None
        """For a restored session: how each code cell fared (else None)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(id={self.id!r}, state={self.last_info.state!r})"

    def _info_call(self) -> _Call[SessionInfo]:
        return _Call("GET", _session_path(self.id), self._update_info)

    def _update_info(self, response: httpx.Response) -> SessionInfo:
        self.last_info = SessionInfo.model_validate(response.json())
        return self.last_info

    def _execute_call(self, code: str, timeout: float | None, execution_id: str | None) -> _Call[Execution]:
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

    # --- history, notebooks

    def _notebook_call(self, path: str | os.PathLike[str] | None) -> _Call[dict[str, Any]]:
        return _notebook_call(self.id, path)

    def _note_call(self, markdown: str) -> _Call[dict[str, Any]]:
        return _Call("POST", _session_path(self.id, "/notes"), lambda r: r.json(), json={"markdown": markdown})

    def _history_call(self) -> _Call[list[Execution]]:
        return _history_call(self.id)

    # --- workspace files and packages

    def _file_path(self, remote: str) -> str:
        # '.' and '..' are escaped so that no HTTP client drops them from the URL:
        # the gateway sees them and refuses the path with a clear 400
        parts = [quote(p, safe="") if p not in (".", "..") else p.replace(".", "%2E") for p in remote.split("/")]
        return _session_path(self.id, "/files/" + "/".join(parts))

    def _upload_call(self, remote: str, content: Any, length: int) -> _Call[UploadResult]:
        return _Call(
            "PUT",
            self._file_path(remote),
            lambda r: UploadResult.model_validate(r.json()),
            content=content,
            headers={"content-length": str(length), "content-type": "application/octet-stream"},
        )

    def _files_call(self, path: str, recursive: bool) -> _Call[list[FileEntry]]:
        return _Call(
            "GET",
            _session_path(self.id, "/files"),
            lambda r: FileList.model_validate(r.json()).entries,
            params={"path": path, "recursive": "true" if recursive else "false"},
        )

    def _delete_file_call(self, remote: str) -> _Call[None]:
        return _Call("DELETE", self._file_path(remote), _no_content)

    def _install_call(self, packages: str | list[str]) -> _Call[InstallResult]:
        names = [packages] if isinstance(packages, str) else list(packages)
        return _Call(
            "POST",
            _session_path(self.id, "/packages"),
            lambda r: InstallResult.model_validate(r.json()),
            json={"packages": names},
            timeout=httpx.Timeout(self._client.timeout, read=INSTALL_TIMEOUT),
        )


def _upload_source(source: str | os.PathLike[str] | bytes, remote: str | None) -> tuple[str, Path | bytes]:
    """(remote path, local file or bytes) for ``upload``; a file keeps its name."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        if remote is None:
            raise ValueError("upload(bytes) needs the remote path, e.g. upload(data, 'data.csv')")
        return remote, bytes(source)
    path = Path(source)
    if not path.is_file():
        raise FileNotFoundError(f"no such file to upload: {path}")
    return remote if remote is not None else path.name, path


def _raise_for_download(response: httpx.Response, body: bytes) -> None:
    if not response.is_success:
        raise error_from_response(response.status_code, body, response.reason_phrase)


def _partial_path(local: Path) -> Path:
    """Where a download is written until it is complete (then renamed)."""
    return local.with_name(f".{local.name}.part")


def _notebook_call(session_id: str, path: str | os.PathLike[str] | None) -> _Call[dict[str, Any]]:
    def parse(response: httpx.Response) -> dict[str, Any]:
        if path is not None:
            Path(path).write_bytes(response.content)
        return response.json()  # type: ignore[no-any-return]

    return _Call("GET", _session_path(session_id, "/notebook"), parse)


def _history_call(session_id: str) -> _Call[list[Execution]]:
    return _Call(
        "GET",
        _session_path(session_id, "/history"),
        lambda r: [Execution(e["events"], execution_id=e["execution_id"]) for e in r.json()["executions"]],
    )


class _StreamState:
    """The WebSocket protocol of one streamed execution, without the I/O.

    The shell loop is: connect to `url`; send `hello()` if not None; `feed` every
    frame and yield what it returns until `finished`. When the connection closes
    early, `closed` either raises or returns, and the loop reconnects: the
    execution keeps running on the gateway, and ``last_seq`` replays what was
    missed. The execute message is sent only until the gateway acknowledges it
    with an event, so a reconnect never runs the code twice.
    """

    def __init__(self, client: _BaseClient, session_id: str, code: str, timeout: float | None) -> None:
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
        raise error_from_response(response.status_code, bytes(response.body or b""), response.reason_phrase)


# ------------------------------------------------------------------------- sync


class Session(_SessionBase["Client"]):
    """A kernel on the gateway. Get one from `Client.create_session` / `.session()`.

    Used as a context manager, it is deleted on exit.
    """

    def info(self) -> SessionInfo:
        return self._client._send(self._info_call())

    def run(self, code: str, *, timeout: float | None = None, execution_id: str | None = None) -> Execution:
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

    def export_notebook(self, path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
        """The session as an nbformat v4 notebook (a dict); also written to ``path``
        as an .ipynb file when given. Works after the session was deleted."""
        return self._client._send(self._notebook_call(path))

    def add_note(self, markdown: str) -> dict[str, Any]:
        """Add a markdown cell to the session's notebook at the current position."""
        return self._client._send(self._note_call(markdown))

    def history(self) -> list[Execution]:
        """Every stored execution of the session, oldest first (``.code``,
        ``.status``, ``.outputs``, ...). Works after the session was deleted."""
        return self._client._send(self._history_call())

    # --- workspace files and packages

    def upload(self, source: str | os.PathLike[str] | bytes, remote: str | None = None) -> UploadResult:
        """Write a local file (streamed, never read whole) or ``bytes`` to ``remote``
        in the session's workspace (default: the file's name). Its parent
        directories are made; an existing file is replaced."""
        remote, data = _upload_source(source, remote)
        if isinstance(data, bytes):
            return self._client._send(self._upload_call(remote, data, len(data)))
        with data.open("rb") as f:
            return self._client._send(self._upload_call(remote, f, os.fstat(f.fileno()).st_size))

    def download(self, remote: str, local_path: str | os.PathLike[str] | None = None) -> bytes | Path:
        """A workspace file: its bytes, or with ``local_path`` streamed into that
        file (written whole or not at all) and its ``Path`` returned."""
        with self._client._http.stream("GET", self._client._url(self._file_path(remote))) as r:
            if local_path is None or not r.is_success:
                body = r.read()
                _raise_for_download(r, body)
                return body
            local = Path(local_path)
            part = _partial_path(local)
            try:
                with part.open("wb") as f:
                    for chunk in r.iter_bytes(FILE_CHUNK):
                        f.write(chunk)
                part.replace(local)
            finally:
                part.unlink(missing_ok=True)
            return local

    def files(self, path: str = "", *, recursive: bool = False) -> list[FileEntry]:
        """The workspace's entries (``path``: a directory in it), with type, size, mtime."""
        return self._client._send(self._files_call(path, recursive))

    def delete_file(self, remote: str) -> None:
        """Remove a workspace file, a directory with its contents, or a symlink itself."""
        self._client._send(self._delete_file_call(remote))

    def install(self, packages: str | list[str]) -> InstallResult:
        """Install packages the gateway allows (and their dependencies) into the
        session, offline: they import in the next cell, no restart."""
        return self._client._send(self._install_call(packages))

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.delete(missing_ok=True)


class Client(_BaseClient):
    """Synchronous client of a kernelgw gateway.

    ``timeout`` applies to ordinary requests, ``start_timeout`` to those that
    start a kernel; executions get their own timeout plus a margin. ``transport``
    is passed to httpx (e.g. ``httpx.MockTransport`` in tests). ``api_key``
    (default: the ``KERNELGW_API_KEY`` environment variable) goes as a Bearer
    token on every request and on the WebSocket handshake.
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
        api_key: str | None = None,
    ) -> None:
        super().__init__(base_url, timeout=timeout, start_timeout=start_timeout, headers=headers, api_key=api_key)
        self._http = httpx.Client(timeout=timeout, headers=self.headers, transport=transport)

    def _send(self, call: _Call[T]) -> T:
        response = self._http.request(
            call.method,
            self._url(call.path),
            json=call.json,
            timeout=call.timeout,
            content=call.content,
            params=call.params,
            headers=call.headers,
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
        notebook: NotebookSource | None = None,
        from_session: str | None = None,
    ) -> Session:
        """Start a kernel. ``timeout`` is the session's default per-execution timeout.

        Restore: with ``notebook`` (a dict or an .ipynb path) or ``from_session`` (the
        id of a stored, possibly deleted session) the code cells are replayed in the
        new kernel first; ``session.replay`` says how each cell fared."""
        session: Session = self._send(
            self._create_call(
                memory_mb=memory_mb,
                cpus=cpus,
                env=env,
                image=image,
                timeout=timeout,
                notebook=notebook,
                from_session=from_session,
            )
        )
        return session

    @contextlib.contextmanager
    def session(
        self,
        *,
        memory_mb: int | None = None,
        cpus: float | None = None,
        env: Mapping[str, str] | None = None,
        image: str | None = None,
        timeout: float | None = None,
        notebook: NotebookSource | None = None,
        from_session: str | None = None,
    ) -> Iterator[Session]:
        """A new session, deleted when the ``with`` block ends."""
        with self.create_session(
            memory_mb=memory_mb,
            cpus=cpus,
            env=env,
            image=image,
            timeout=timeout,
            notebook=notebook,
            from_session=from_session,
        ) as session:
            yield session

    def get_session(self, session_id: str) -> Session:
        session: Session = self._send(self._get_call(session_id))
        return session

    def list_sessions(self) -> list[Session]:
        return self._send(self._list_call())

    def export_notebook(self, session_id: str, path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
        """The notebook of any session with stored history, live or deleted."""
        return self._send(_notebook_call(session_id, path))

    def history(self, session_id: str) -> list[Execution]:
        """The stored executions of any session, live or deleted."""
        return self._send(_history_call(session_id))

    def images(self) -> ImageList:
        """The kernel images sessions may use, their preinstalled packages, and
        the packages sessions may install."""
        return self._send(self._images_call())

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

    async def run(self, code: str, *, timeout: float | None = None, execution_id: str | None = None) -> Execution:
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

    async def export_notebook(self, path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
        return await self._client._send(self._notebook_call(path))

    async def add_note(self, markdown: str) -> dict[str, Any]:
        return await self._client._send(self._note_call(markdown))

    async def history(self) -> list[Execution]:
        return await self._client._send(self._history_call())

    # --- workspace files and packages

    async def upload(self, source: str | os.PathLike[str] | bytes, remote: str | None = None) -> UploadResult:
        remote, data = _upload_source(source, remote)
        if isinstance(data, bytes):
            return await self._client._send(self._upload_call(remote, data, len(data)))
        with data.open("rb") as f:
            size = os.fstat(f.fileno()).st_size

            async def chunks() -> AsyncIterator[bytes]:
                while chunk := await asyncio.to_thread(f.read, FILE_CHUNK):
                    yield chunk

            return await self._client._send(self._upload_call(remote, chunks(), size))

    async def download(self, remote: str, local_path: str | os.PathLike[str] | None = None) -> bytes | Path:
        async with self._client._http.stream("GET", self._client._url(self._file_path(remote))) as r:
            if local_path is None or not r.is_success:
                body = await r.aread()
                _raise_for_download(r, body)
                return body
            local = Path(local_path)
            part = _partial_path(local)
            try:
                with part.open("wb") as f:
                    async for chunk in r.aiter_bytes(FILE_CHUNK):
                        await asyncio.to_thread(f.write, chunk)
                part.replace(local)
            finally:
                part.unlink(missing_ok=True)
            return local

    async def files(self, path: str = "", *, recursive: bool = False) -> list[FileEntry]:
        return await self._client._send(self._files_call(path, recursive))

    async def delete_file(self, remote: str) -> None:
        await self._client._send(self._delete_file_call(remote))

    async def install(self, packages: str | list[str]) -> InstallResult:
        return await self._client._send(self._install_call(packages))

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
        api_key: str | None = None,
    ) -> None:
        super().__init__(base_url, timeout=timeout, start_timeout=start_timeout, headers=headers, api_key=api_key)
        self._http = httpx.AsyncClient(timeout=timeout, headers=self.headers, transport=transport)

    async def _send(self, call: _Call[T]) -> T:
        response = await self._http.request(
            call.method,
            self._url(call.path),
            json=call.json,
            timeout=call.timeout,
            content=call.content,
            params=call.params,
            headers=call.headers,
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
        notebook: NotebookSource | None = None,
        from_session: str | None = None,
    ) -> AsyncSession:
        return await self._send(
            self._create_call(
                memory_mb=memory_mb,
                cpus=cpus,
                env=env,
                image=image,
                timeout=timeout,
                notebook=notebook,
                from_session=from_session,
            )
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
        notebook: NotebookSource | None = None,
        from_session: str | None = None,
    ) -> AsyncIterator[AsyncSession]:
        async with await self.create_session(
            memory_mb=memory_mb,
            cpus=cpus,
            env=env,
            image=image,
            timeout=timeout,
            notebook=notebook,
            from_session=from_session,
        ) as session:
            yield session

    async def get_session(self, session_id: str) -> AsyncSession:
        return await self._send(self._get_call(session_id))

    async def list_sessions(self) -> list[AsyncSession]:
        return await self._send(self._list_call())

    async def export_notebook(self, session_id: str, path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
        return await self._send(_notebook_call(session_id, path))

    async def history(self, session_id: str) -> list[Execution]:
        return await self._send(_history_call(session_id))

    async def images(self) -> ImageList:
        return await self._send(self._images_call())

    async def health(self) -> dict[str, Any]:
        return await self._send(self._health_call())

    async def close(self) -> None:
        await self._http.aclose()

    aclose = close

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
