"""/readyz turns 503 when the database stops answering, before any write fails.

A real PostgreSQL (scripts/ensure-postgres.sh) reached through a TCP relay in
this process: closing the relay is the database going away (a network split,
a stopped server), and opening it again on the same port brings it back.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import pytest
from sqlalchemy.engine import make_url

from tests.support.app import local_settings, serve
from tests.support.local_backend import LocalBackend
from tests.support.postgres import postgres_url

DEADLINE_S = 30.0


class Relay:
    """Forwards TCP connections from 127.0.0.1:<port> to ``target``; `cut` drops them all."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def open(self) -> None:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def cut(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        await self._server.wait_closed()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self._writers |= {writer, up_writer}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.transport.abort()

        try:
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        finally:
            self._writers -= {writer, up_writer}


@pytest.fixture
async def relay() -> AsyncIterator[tuple[Relay, str]]:
    url = make_url(postgres_url())
    r = Relay((url.host or "127.0.0.1", url.port or 5432))
    await r.open()
    try:
        yield r, url.set(host="127.0.0.1", port=r.port).render_as_string(hide_password=False)
    finally:
        with contextlib.suppress(Exception):
            await r.cut()


async def test_readyz_is_503_while_the_database_does_not_answer_and_200_again_after(
    local_backend: LocalBackend, tmp_path: object, relay: tuple[Relay, str]
) -> None:
    proxy, url = relay
    settings = local_settings(tmp_path, database_url=url)  # type: ignore[arg-type]
    async with serve(settings, local_backend) as (_, http):

        async def readiness(expected: int) -> dict[str, object]:
            deadline = time.monotonic() + DEADLINE_S
            while (resp := await http.get("/readyz")).status_code != expected:
                assert time.monotonic() < deadline, f"/readyz never answered {expected}: {resp.text}"
                await asyncio.sleep(0.1)
            body: dict[str, object] = resp.json()
            return body

        await readiness(200)
        await proxy.cut()  # nothing is written meanwhile: only the probe can notice
        down = await readiness(503)
        assert "the database does not answer" in str(down["detail"])
        assert (await http.get("/healthz")).status_code == 200  # liveness: a restart would not bring it back
        await proxy.open()  # the same port again
        up = await readiness(200)
        assert "does not answer" not in str(up["detail"])
