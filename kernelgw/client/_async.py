"""The asynchronous SDK: `AsyncClient` and its `AsyncSession`, the same methods
as `Client` and `Session`, awaited; thin shells over the shared base
(`kernelgw.client._base`) that send its calls with httpx's async client and
stream with websockets' asyncio client.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import httpx
from websockets.asyncio.client import connect as _aconnect
from websockets.exceptions import ConnectionClosed, InvalidStatus

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


class AsyncSession(_SessionBase["AsyncClient"]):
    """`Session` for `AsyncClient`: the same methods, awaited."""

    async def info(self) -> SessionInfo:
        return await self._client._send(self._info_call())

    async def run(
        self, code: str, *, timeout: float | None = None, execution_id: str | None = None, replay: bool = True
    ) -> Execution:
        return await self._client._send(self._execute_call(code, timeout, execution_id, replay))

    async def stream(self, code: str, *, timeout: float | None = None, replay: bool = True) -> AsyncIterator[Event]:
        state = self._stream_state(code, timeout, replay)
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

    async def fork(
        self, *, memory_mb: int | None = None, cpus: float | None = None, timeout: float | None = None
    ) -> AsyncSession:
        """A new session with a copy of this one's files and installed packages and
        its state rebuilt by replaying the cells that built it; then the two go
        their own way. Settings are this session's unless given. ``fork_report``
        of the new session says what was copied and replayed."""
        forked: AsyncSession = await self._client._send(self._fork_call(memory_mb, cpus, timeout))
        return forked

    async def pause(self) -> PausedSession:
        """Free the kernel's container and keep the session's state on the gateway's
        disk: files, packages and the variables that pickle (``.namespace.failed``
        names the others). The next run, file or package call resumes it."""
        return await self._client._send(self._pause_call())

    async def resume(self, *, replay: bool = False) -> ResumedSession:
        """Bring a paused session back now. ``replay=True``: rebuild by replay what
        could not be pickled (the saved values are loaded over it)."""
        return await self._client._send(self._resume_call(replay))

    async def restart(self, *, replay: bool = False) -> RestartedSession:
        return await self._client._send(self._restart_call(replay))

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
        kernel: str | None = None,
        memory_mb: int | None = None,
        cpus: float | None = None,
        env: Mapping[str, str] | None = None,
        image: str | None = None,
        timeout: float | None = None,
        notebook: NotebookSource | None = None,
        from_session: str | None = None,
        auto_replay: bool = False,
    ) -> AsyncSession:
        return await self._send(
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

    @contextlib.asynccontextmanager
    async def session(
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
    ) -> AsyncIterator[AsyncSession]:
        async with await self.create_session(
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

    async def get_session(self, session_id: str) -> AsyncSession:
        return await self._send(self._get_call(session_id))

    async def list_sessions(self) -> list[AsyncSession]:
        return await self._send(self._list_call())

    async def export_notebook(self, session_id: str, path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
        return await self._send(_notebook_call(session_id, path))

    async def history(self, session_id: str) -> list[Execution]:
        return await self._send(_history_call(session_id))

    async def kernels(self) -> list[KernelInfo]:
        return await self._send(self._kernels_call())

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
