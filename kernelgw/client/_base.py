"""The request builder `Client` and `AsyncClient` share: `_BaseClient` and
`_SessionBase` build every request and parse every answer as a `_Call`; the
clients in `kernelgw.client._sync` and `kernelgw.client._async` only send it,
with httpx's sync or async client. Also the defaults both clients use and the
small helpers of uploads, downloads, notebooks and history.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar, Union
from urllib.parse import quote, urlencode, urlsplit, urlunsplit

import httpx

from kernelgw.client._errors import error_from_response
from kernelgw.client._stream import _StreamState
from kernelgw.client.execution import Execution
from kernelgw.models import (
    CreatedSession,
    FileEntry,
    FileList,
    ForkReport,
    ImageList,
    InstallResult,
    KernelInfo,
    KernelList,
    PausedSession,
    ReplayedCell,
    RestartedSession,
    ResumedSession,
    SessionInfo,
    UploadResult,
)

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

T = TypeVar("T")
C = TypeVar("C", bound="_BaseClient")
InfoT = TypeVar("InfoT", bound=SessionInfo)


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


# ------------------------------------------------------------------------ calls


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
        auto_replay: bool = False,
        fork_of: str | None = None,
        kernel: str | None = None,
    ) -> _Call[Any]:
        body = {
            k: v
            for k, v in {
                "kernel": kernel,  # sent only when given: older gateways refuse it
                "memory_mb": memory_mb,
                "cpus": cpus,
                "env": dict(env) if env is not None else None,
                "image": image,
                "timeout": timeout,
                "notebook": _notebook_json(notebook) if notebook is not None else None,
                "from_session": from_session,
                "auto_replay": True if auto_replay else None,  # sent only when asked: older gateways refuse it
                "from": fork_of,
            }.items()
            if v is not None
        }
        restoring = notebook is not None or from_session is not None or fork_of is not None
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

    def _kernels_call(self) -> _Call[list[KernelInfo]]:
        return _Call("GET", "/v1/kernels", lambda r: KernelList.model_validate(r.json()).kernels)

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
        self.fork_report: ForkReport | None = info.fork if isinstance(info, CreatedSession) else None
        """For a fork (`fork`): what was copied and replayed (else None)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(id={self.id!r}, state={self.last_info.state!r})"

    def _info_call(self) -> _Call[SessionInfo]:
        return _Call("GET", _session_path(self.id), self._update_info)

    def _update_info(self, response: httpx.Response) -> SessionInfo:
        self.last_info = SessionInfo.model_validate(response.json())
        return self.last_info

    def _execute_call(
        self, code: str, timeout: float | None, execution_id: str | None, replay: bool = True
    ) -> _Call[Execution]:
        body: dict[str, Any] = {"code": code}
        if timeout is not None:
            body["timeout"] = timeout
        if execution_id is not None:
            body["execution_id"] = execution_id
        if not replay:
            body["replay"] = False
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

    def _fork_call(self, memory_mb: int | None, cpus: float | None, timeout: float | None) -> _Call[Any]:
        return self._client._create_call(
            memory_mb=memory_mb, cpus=cpus, env=None, image=None, timeout=timeout, fork_of=self.id
        )

    def _parse_info(self, model: type[InfoT]) -> Callable[[httpx.Response], InfoT]:
        """A parser that reads the answer as ``model`` and keeps it as ``last_info``."""

        def parse(response: httpx.Response) -> InfoT:
            info = model.model_validate(response.json())
            self.last_info = info
            return info

        return parse

    def _pause_call(self) -> _Call[PausedSession]:
        # saving a large namespace takes a while: no read timeout
        long = httpx.Timeout(self._client.timeout, read=None)
        return _Call("POST", _session_path(self.id, "/pause"), self._parse_info(PausedSession), timeout=long)

    def _resume_call(self, replay: bool) -> _Call[ResumedSession]:
        return _Call(
            "POST",
            _session_path(self.id, "/resume"),
            self._parse_info(ResumedSession),
            json={"replay": True} if replay else None,
            timeout=httpx.Timeout(self._client.timeout, read=None),
        )

    def _restart_call(self, replay: bool = False) -> _Call[RestartedSession]:
        return _Call(
            "POST",
            _session_path(self.id, "/restart"),
            self._parse_info(RestartedSession),
            json={"replay": True} if replay else None,
            # a replay answers after re-running every cell: no read timeout then
            timeout=httpx.Timeout(self._client.timeout, read=None) if replay else self._client._start_timeout(),
        )

    def _delete_call(self, missing_ok: bool = False) -> _Call[None]:
        allow = frozenset({404}) if missing_ok else frozenset()
        return _Call("DELETE", _session_path(self.id), _no_content, allow=allow)

    def _stream_state(self, code: str, timeout: float | None, replay: bool = True) -> _StreamState:
        return _StreamState(self._client, self.id, code, timeout, replay=replay)

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
            # a session's first file starts its workspace store (a container): the
            # answer may take as long as a kernel's start
            timeout=self._client._start_timeout(),
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
