"""`kernelgw mcp` against a real gateway, driven by the MCP SDK's own client.

Three ways in, each a real `kernelgw mcp` subprocess:

* ``stdio``: spawned by the SDK's `stdio_client` (one client per process);
* ``http-session``: streamable HTTP with the 2025 handshake protocol
  (``mode="legacy"``: ``initialize``, an ``Mcp-Session-Id``);
* ``http-stateless``: streamable HTTP with the 2026-07-28 protocol (the SDK's
  default), where the sandbox is named by the ``sandbox_id`` handle that the
  first result returns.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

pytest.importorskip("mcp", reason="needs the mcp extra: pip install 'kernelgw[mcp]'")

from mcp import Client, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult, EmbeddedResource, ImageContent, TextContent

from kernelgw.client import Client as GatewayClient
from kernelgw.integrations.mcp import META_KEY
from tests.integration.conftest import free_port

pytestmark = pytest.mark.integration

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
MODES = ["stdio", "http-session", "http-stateless"]
TOOLS = {"run_python", "upload_file", "download_file", "list_files", "export_notebook", "reset_session"}
PLOT = "import matplotlib.pyplot as plt\nplt.plot([1, 4, 9])\nplt.show()"


def _start_http_server(gateway_url: str, *extra: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kernelgw",
            "mcp",
            "--transport",
            "http",
            "--port",
            str(port),
            "--server",
            gateway_url,
            *extra,
        ],
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("kernelgw mcp --transport http did not start") from None
            time.sleep(0.05)
    return proc, f"http://127.0.0.1:{port}/mcp"


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    # uvicorn shuts down gracefully, then re-raises the signal: -SIGTERM is a clean exit
    assert proc.wait(timeout=60) in (0, -signal.SIGTERM)


def gateway_session_ids(gateway_url: str) -> set[str]:
    with GatewayClient(gateway_url) as client:
        return {s.id for s in client.list_sessions()}


CREATED: set[str] = set()
"""Every sandbox the MCP servers reported, to check that none outlives its server."""


@pytest.fixture(scope="module")
def mcp_http_url(gateway_url: str) -> Iterator[str]:
    proc, url = _start_http_server(gateway_url)
    yield url
    _stop(proc)
    # at shutdown the server deleted the sandboxes it still had (stateless clients')
    assert not (CREATED & gateway_session_ids(gateway_url))


class Connection:
    """One MCP client session; passes the sandbox handle back on the stateless protocol."""

    def __init__(self, client: Client, stateless: bool) -> None:
        self.client = client
        self.stateless = stateless
        self.sandbox_id: str | None = None
        self.seen: set[str] = set()

    async def call(self, name: str, **arguments: Any) -> CallToolResult:
        if self.stateless and self.sandbox_id is not None:
            arguments.setdefault("sandbox_id", self.sandbox_id)
        result = await self.client.call_tool(name, arguments)
        sandbox = (result.meta or {}).get(META_KEY)
        if sandbox is not None:
            self.seen.add(sandbox)
            CREATED.add(sandbox)
            if self.sandbox_id is None:
                self.sandbox_id = sandbox
        return result


@contextlib.asynccontextmanager
async def connect(mode: str, gateway_url: str, http_url: str) -> AsyncIterator[Connection]:
    if mode == "stdio":
        params = StdioServerParameters(
            command=sys.executable,
            args=["-m", "kernelgw", "mcp", "--server", gateway_url],
        )
        client = Client(stdio_client(params))
    elif mode == "http-session":
        client = Client(streamable_http_client(http_url), mode="legacy")
    else:
        client = Client(streamable_http_client(http_url))
    async with client:
        yield Connection(client, stateless=mode == "http-stateless")


def texts(result: CallToolResult) -> list[str]:
    return [c.text for c in result.content if isinstance(c, TextContent)]


def text(result: CallToolResult) -> str:
    return texts(result)[0]


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def http_url(mode: str, request: pytest.FixtureRequest) -> str:
    # the HTTP server is started only for the HTTP modes
    return "" if mode == "stdio" else str(request.getfixturevalue("mcp_http_url"))


# ----------------------------------------------------------------------- tools


async def test_lists_the_tools(mode: str, gateway_url: str, http_url: str) -> None:
    async with connect(mode, gateway_url, http_url) as conn:
        tools = {t.name: t for t in (await conn.client.list_tools()).tools}
    assert set(tools) == TOOLS
    run = tools["run_python"]
    assert run.input_schema["required"] == ["code"]
    assert "stateful" in (run.description or "")
    assert "sandbox_id" in tools["list_files"].input_schema["properties"]


async def test_state_across_calls_and_images(mode: str, gateway_url: str, http_url: str) -> None:
    async with connect(mode, gateway_url, http_url) as conn:
        first = await conn.call("run_python", code="x = 41\nprint('set')")
        assert text(first) == "stdout:\nset" and not first.is_error
        if mode == "http-stateless":  # the handle is in the text too, for the model
            assert f"sandbox_id: {conn.sandbox_id}" in texts(first)[-1]
        second = await conn.call("run_python", code="x + 1")
        assert text(second) == "result:\n42"

        plot = await conn.call("run_python", code=PLOT)
        images = [c for c in plot.content if isinstance(c, ImageContent)]
        assert len(images) == 1 and images[0].mime_type == "image/png"
        assert base64.b64decode(images[0].data).startswith(PNG_MAGIC)
        assert "displayed: 1 image (image/png)" in text(plot)

        failed = await conn.call("run_python", code="1 / 0")
        assert failed.is_error
        assert text(failed).startswith("error: ZeroDivisionError: division by zero")
        assert len(conn.seen) == 1  # one sandbox for the whole client session


async def test_upload_list_download(mode: str, gateway_url: str, http_url: str) -> None:
    blob = bytes(range(256))
    async with connect(mode, gateway_url, http_url) as conn:
        up = await conn.call("upload_file", path="data/sales.csv", content="region,units\nnorth,3\nsouth,5\n")
        assert text(up) == "created data/sales.csv (29 bytes)"
        await conn.call("upload_file", path="blob.bin", content=base64.b64encode(blob).decode(), encoding="base64")

        listing = text(await conn.call("list_files", recursive=True))
        lines = listing.splitlines()
        assert any(line.startswith("data/sales.csv\t29 bytes") for line in lines), listing
        assert any(line.startswith("blob.bin\t256 bytes") for line in lines), listing

        run = await conn.call(
            "run_python",
            code="import pandas as pd\ndf = pd.read_csv('data/sales.csv')\ndf.units.sum()\n"
            "df.to_json('data/out.json', orient='records')",
        )
        assert "files: created data/out.json" in text(run)

        down = await conn.call("download_file", path="data/out.json")
        [resource] = [c for c in down.content if isinstance(c, EmbeddedResource)]
        assert json.loads(resource.resource.text) == [  # type: ignore[union-attr]
            {"region": "north", "units": 3},
            {"region": "south", "units": 5},
        ]
        assert resource.resource.mime_type == "application/json"

        binary = await conn.call("download_file", path="blob.bin")
        [resource] = [c for c in binary.content if isinstance(c, EmbeddedResource)]
        assert base64.b64decode(resource.resource.blob) == blob  # type: ignore[union-attr]

        await conn.call("run_python", code="import matplotlib.pyplot as plt\nplt.plot([1, 2]); plt.savefig('p.png')")
        picture = await conn.call("download_file", path="p.png")
        [image] = [c for c in picture.content if isinstance(c, ImageContent)]
        assert base64.b64decode(image.data).startswith(PNG_MAGIC)

        missing = await conn.call("download_file", path="nope.txt")
        assert missing.is_error and "file_not_found" in text(missing)


async def test_export_notebook_and_reset(mode: str, gateway_url: str, http_url: str) -> None:
    async with connect(mode, gateway_url, http_url) as conn:
        await conn.call("run_python", code="y = 6 * 7")
        await conn.call("run_python", code="print(y)")
        exported = await conn.call("export_notebook")
        assert text(exported) == "notebook with 2 code cells"
        [resource] = [c for c in exported.content if isinstance(c, EmbeddedResource)]
        assert resource.resource.mime_type == "application/x-ipynb+json"
        notebook = json.loads(resource.resource.text)  # type: ignore[union-attr]
        assert notebook["nbformat"] == 4
        sources = ["".join(c["source"]) for c in notebook["cells"] if c["cell_type"] == "code"]
        assert sources == ["y = 6 * 7", "print(y)"]
        assert notebook["cells"][1]["outputs"][0]["text"] in ("42\n", ["42\n"])

        reset = await conn.call("reset_session")
        assert "restarted" in text(reset)
        after = await conn.call("run_python", code="y")
        assert after.is_error and "NameError" in text(after)
        assert len(conn.seen) == 1  # reset keeps the sandbox, only its state is gone


async def test_two_client_sessions_do_not_share_state(mode: str, gateway_url: str, http_url: str) -> None:
    async with connect(mode, gateway_url, http_url) as a, connect(mode, gateway_url, http_url) as b:
        await a.call("run_python", code="secret = 'a'")
        other = await b.call("run_python", code="secret")
        assert other.is_error and "NameError" in text(other)
        await b.call("run_python", code="secret = 'b'")
        assert text(await a.call("run_python", code="secret")) == "result:\n'a'"
        assert a.seen.isdisjoint(b.seen)


@pytest.mark.parametrize("mode", ["stdio", "http-session"])  # 2026-07-28 has no client sessions: see below
async def test_a_sandbox_ends_with_its_client_session(mode: str, gateway_url: str, http_url: str) -> None:
    async with connect(mode, gateway_url, http_url) as conn:
        await conn.call("run_python", code="1")
        assert conn.seen <= gateway_session_ids(gateway_url)
    deadline = time.monotonic() + 10
    while conn.seen & gateway_session_ids(gateway_url):
        assert time.monotonic() < deadline, "the sandbox outlived its MCP session"
        await asyncio.sleep(0.1)


async def test_foreign_sandbox_ids_are_refused(mode: str, gateway_url: str, http_url: str) -> None:
    with GatewayClient(gateway_url) as gateway, gateway.session() as other:
        async with connect(mode, gateway_url, http_url) as conn:
            # a gateway session this MCP server did not create is not reachable
            result = await conn.client.call_tool("run_python", {"code": "1", "sandbox_id": other.id})
            assert result.is_error and f"There is no sandbox {other.id!r}" in text(result)
            listing = await conn.client.call_tool("list_files", {"sandbox_id": "nope"})
            assert listing.is_error


async def test_stateless_sandboxes_are_deleted_when_idle(gateway_url: str) -> None:
    proc, url = _start_http_server(gateway_url, "--idle-timeout", "1")
    try:
        async with connect("http-stateless", gateway_url, url) as conn:
            await conn.call("run_python", code="z = 1")
            assert conn.sandbox_id in gateway_session_ids(gateway_url)
            deadline = time.monotonic() + 15
            while conn.sandbox_id in gateway_session_ids(gateway_url):
                assert time.monotonic() < deadline, "the idle sandbox was not deleted"
                await asyncio.sleep(0.2)
            gone = await conn.call("run_python", code="z")
            assert gone.is_error and "There is no sandbox" in text(gone)
    finally:
        _stop(proc)


async def test_a_sandbox_the_gateway_ended_is_replaced(mode: str, gateway_url: str, http_url: str) -> None:
    async with connect(mode, gateway_url, http_url) as conn:
        await conn.call("run_python", code="v = 1")
        [first] = conn.seen
        with GatewayClient(gateway_url) as gateway:  # e.g. the gateway's idle reaper
            gateway.get_session(first).delete()
        again = await conn.call("run_python", code="v")
        assert again.is_error
        if mode == "http-stateless":  # the call named the sandbox: it is not silently swapped
            assert f"The sandbox {first!r} has ended" in text(again)
            return
        assert text(again).startswith("note: the previous sandbox had ended")
        assert "error: NameError: name 'v' is not defined" in text(again)
        assert text(await conn.call("run_python", code="v = 2\nv")) == "result:\n2"
        assert len(conn.seen) == 2


async def test_an_unreachable_gateway_is_a_tool_error() -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    async with connect("stdio", dead, "") as conn:
        result = await conn.client.call_tool("run_python", {"code": "1"})
    assert result.is_error
    assert "could not start a sandbox: the kernelgw gateway did not answer (ConnectError" in text(result)
