"""The synchronous SDK: `Client` and its `Session`, thin shells over the shared
base (`kernelgw.client._base`) that send its calls with httpx and stream with
websockets' sync client.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect as _connect

from kernelgw.client._base import (
    DEFAULT_TIMEOUT,
    DEFAULT_URL,
    FILE_CHUNK,
    START_TIMEOUT,
    NotebookSource,
    T,
    _BaseClient,
    _Call,
    _history_call,
    _notebook_call,
    _partial_path,
    _raise_for_download,
    _SessionBase,
    _upload_source,
)
from kernelgw.client.execution import Execution
from kernelgw.events import Event
from kernelgw.models import (
    FileEntry,
    ImageList,
    InstallResult,
    KernelInfo,
    PausedSession,
    RestartedSession,
    ResumedSession,
    SessionInfo,
    UploadResult,
)


class Session(_SessionBase["Client"]):
    """A kernel on the gateway. Get one from `Client.create_session` / `.session()`.

    Used as a context manager, it is deleted on exit.
    """

    def info(self) -> SessionInfo:
        return self._client._send(self._info_call())

    def run(
        self, code: str, *, timeout: float | None = None, execution_id: str | None = None, replay: bool = True
    ) -> Execution:
        """Run ``code`` and wait for it; errors in the code do not raise (see
        `Execution.raise_for_error`). ``replay=False``: a replay (`restart`)
        never runs this cell again (side effects: sending mail, writing a database)."""
        return self._client._send(self._execute_call(code, timeout, execution_id, replay))

    def stream(self, code: str, *, timeout: float | None = None, replay: bool = True) -> Iterator[Event]:
        """Run ``code``, yielding its events live; the last one is ``done``."""
        state = self._stream_state(code, timeout, replay)
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

    def fork(self, *, memory_mb: int | None = None, cpus: float | None = None, timeout: float | None = None) -> Session:
        """A new session with a copy of this one's files and installed packages and
        its state rebuilt by replaying the cells that built it; then the two go
        their own way. Settings are this session's unless given. ``fork_report``
        of the new session says what was copied and replayed."""
        forked: Session = self._client._send(self._fork_call(memory_mb, cpus, timeout))
        return forked

    def pause(self) -> PausedSession:
        """Free the kernel's container and keep the session's state on the gateway's
        disk: files, packages and the variables that pickle (``.namespace.failed``
        names the others). The next run, file or package call resumes it."""
        return self._client._send(self._pause_call())

    def resume(self, *, replay: bool = False) -> ResumedSession:
        """Bring a paused session back now. ``replay=True``: rebuild by replay what
        could not be pickled (the saved values are loaded over it)."""
        return self._client._send(self._resume_call(replay))

    def restart(self, *, replay: bool = False) -> RestartedSession:
        """Restart the kernel: its variables are lost, the session id stays.

        ``replay=True``: the cells that built the old kernel's state run again in
        the new one, up to the first that fails; ``.replay`` of the answer says
        how each fared and how long it took."""
        return self._client._send(self._restart_call(replay))

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
        kernel: str | None = None,
        memory_mb: int | None = None,
        cpus: float | None = None,
        env: Mapping[str, str] | None = None,
        image: str | None = None,
        timeout: float | None = None,
        notebook: NotebookSource | None = None,
        from_session: str | None = None,
        auto_replay: bool = False,
    ) -> Session:
        """Start a kernel. ``kernel``: its language by kernelspec name (python3, deno,
        ir, bash, java, go, cpp, ruby: one the gateway offers, see ``kernels()``;
        default the gateway's first). ``timeout`` is the session's default
        per-execution timeout.

        Restore: with ``notebook`` (a dict or an .ipynb path) or ``from_session`` (the
        id of a stored, possibly deleted session) the code cells are replayed in the
        new kernel first; ``session.replay`` says how each cell fared.
        ``auto_replay``: when the kernel dies under a cell (out of memory) or is
        restarted after ignoring a timeout, the gateway restarts it and replays
        the cells that built its state."""
        session: Session = self._send(
            self._create_call(
                kernel=kernel,
                memory_mb=memory_mb,
                cpus=cpus,
                env=env,
                image=image,
                timeout=timeout,
                notebook=notebook,
                from_session=from_session,
                auto_replay=auto_replay,
            )
        )
        return session

    @contextlib.contextmanager
    def session(
        self,
        *,
        kernel: str | None = None,
        memory_mb: int | None = None,
        cpus: float | None = None,
        env: Mapping[str, str] | None = None,
        image: str | None = None,
        timeout: float | None = None,
        notebook: NotebookSource | None = None,
        from_session: str | None = None,
        auto_replay: bool = False,
    ) -> Iterator[Session]:
        """A new session, deleted when the ``with`` block ends."""
        with self.create_session(
            kernel=kernel,
            memory_mb=memory_mb,
            cpus=cpus,
            env=env,
            image=image,
            timeout=timeout,
            notebook=notebook,
            from_session=from_session,
            auto_replay=auto_replay,
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

    def kernels(self) -> list[KernelInfo]:
        """The kernels (languages) the gateway offers: ``kernel`` on create takes
        their names."""
        return self._send(self._kernels_call())

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
