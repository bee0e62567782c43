"""An MCP server that gives MCP clients a kernelgw sandbox (``pip install 'kernelgw[mcp]'``).

    kernelgw mcp --server http://127.0.0.1:8000                        # stdio
    kernelgw mcp --server http://127.0.0.1:8000 --transport http --port 8100   # streamable HTTP at /mcp

Built on the official MCP Python SDK (2.x), speaking both protocol eras it
serves: the 2025 handshake protocol (with sessions) and the stateless
2026-07-28 protocol. It is a client of a kernelgw gateway (the SDK's
`AsyncClient`); the kernels run there, never in this process.

Tools: ``run_python`` (text, and images as MCP image content), ``upload_file``,
``download_file``, ``list_files``, ``export_notebook``, ``reset_session``.

Which sandbox (kernelgw session) a tool call uses:

* **stdio**: the server process serves one client, and that client has one
  sandbox, created by its first tool call and deleted when the client goes away
  (stdin closes, or SIGTERM / SIGINT).
* **streamable HTTP, handshake protocol** (clients that send ``initialize`` and
  an ``Mcp-Session-Id``): one sandbox per MCP session, created lazily and
  deleted when the MCP session ends (the client's DELETE, the SDK's idle
  timeout, or server shutdown).
* **streamable HTTP, 2026-07-28 protocol**: there are no MCP sessions. As the
  spec asks, state is named by an explicit handle: a call without ``sandbox_id``
  starts a new sandbox and its result says the id; passing ``sandbox_id`` back
  keeps using it. Such sandboxes are deleted after ``idle_timeout`` seconds
  without a call, and at server shutdown.

Every tool takes an optional ``sandbox_id`` (only ids of sandboxes this server
created are accepted: a client cannot reach other gateway sessions).
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, TypeVar

from kernelgw.integrations import require

require("mcp", "mcp", "kernelgw mcp")

import anyio  # noqa: E402
import httpx  # noqa: E402
from mcp.server.connection import Connection  # noqa: E402
from mcp.server.mcpserver import Context, MCPServer  # noqa: E402
from mcp.server.mcpserver.exceptions import ToolError  # noqa: E402
from mcp_types import (  # noqa: E402
    BlobResourceContents,
    CallToolResult,
    ContentBlock,
    EmbeddedResource,
    ImageContent,
    TextContent,
    TextResourceContents,
    ToolAnnotations,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS  # noqa: E402
from pydantic import Field  # noqa: E402

from kernelgw.client import DEFAULT_URL, AsyncClient, AsyncSession  # noqa: E402
from kernelgw.errors import ClientError  # noqa: E402
from kernelgw.integrations.observation import IMAGE_MIME_TYPES, observe  # noqa: E402
from kernelgw.integrations.tools import CODE_DESCRIPTION, tool_text  # noqa: E402

__all__ = ["DEFAULT_IDLE_TIMEOUT", "SandboxRegistry", "create_server", "http_app", "run_http", "run_stdio"]

log = logging.getLogger("kernelgw.mcp")
T = TypeVar("T")

DEFAULT_IDLE_TIMEOUT = 1800.0
"""Seconds a handle-addressed sandbox (stateless HTTP clients) lives without a call."""
MAX_DOWNLOAD_BYTES = 20 * 1024 * 1024
"""The largest file ``download_file`` returns inline."""
META_KEY = "kernelgw/sandbox_id"
"""``_meta`` key of every tool result: the sandbox the call used."""

SandboxId = Annotated[
    str | None,
    Field(
        description="The sandbox to use, as named by an earlier result. Leave it out to use "
        "this connection's sandbox (stateless HTTP clients: to start a new one)."
    ),
]


# ------------------------------------------------------------------ sandboxes


@dataclass
class Sandbox:
    """A kernelgw session this server created for a client."""

    session: AsyncSession
    kind: Literal["process", "connection", "handle"]
    last_used: float = field(default_factory=time.monotonic)

    @property
    def id(self) -> str:
        return self.session.id


_CONNECTION_KEY = "kernelgw.sandbox"


def _handshake_connection(ctx: Context[Any, Any]) -> Connection | None:
    """The connection of a handshake-era (2025) client: it lives as long as the MCP session.

    mcp 2.x does not expose the connection on the high-level `Context` yet (the
    SDK's own TODO); it is the one the request's `ServerSession` was built on.
    A 2026-07-28 request's connection lives for that request only: None.
    """
    if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
        return None
    connection = getattr(ctx.request_context.session, "_connection", None)
    return connection if isinstance(connection, Connection) else None


class SandboxRegistry:
    """The sandboxes of one MCP server: which call gets which, and their deletion."""

    def __init__(
        self,
        client: AsyncClient,
        *,
        single_client: bool,
        session_options: dict[str, Any] | None = None,
        idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
    ) -> None:
        self.client = client
        self.single_client = single_client
        self.session_options = dict(session_options or {})
        self.idle_timeout = idle_timeout
        self.sandboxes: dict[str, Sandbox] = {}
        self._process_sandbox: Sandbox | None = None
        self._lock = anyio.Lock()

    async def _create(self, kind: Literal["process", "connection", "handle"]) -> Sandbox:
        try:
            session = await self.client.create_session(**self.session_options)
        except GATEWAY_FAILURES as exc:
            raise _gateway_error(exc, "could not start a sandbox") from exc
        sandbox = Sandbox(session, kind)
        self.sandboxes[sandbox.id] = sandbox
        log.info("sandbox %s created (%s)", sandbox.id, kind)
        return sandbox

    async def get(self, ctx: Context[Any, Any], sandbox_id: str | None, *, create: bool = True) -> Sandbox:
        """The sandbox for this call; raises `ToolError` for an unknown ``sandbox_id``."""
        if sandbox_id:
            sandbox = self.sandboxes.get(sandbox_id)
            if sandbox is None:
                raise ToolError(
                    f"There is no sandbox {sandbox_id!r} (it was deleted after being idle, or never "
                    "existed). Call without sandbox_id to start a new one."
                )
        elif self.single_client:
            async with self._lock:
                if self._process_sandbox is None or self._process_sandbox.id not in self.sandboxes:
                    self._process_sandbox = await self._create("process")
                sandbox = self._process_sandbox
        elif (connection := _handshake_connection(ctx)) is not None:
            lock = connection.state.setdefault(_CONNECTION_KEY + ".lock", anyio.Lock())
            async with lock:
                sandbox = connection.state.get(_CONNECTION_KEY)
                if sandbox is None or sandbox.id not in self.sandboxes:
                    sandbox = await self._create("connection")
                    connection.state[_CONNECTION_KEY] = sandbox
                    connection.exit_stack.push_async_callback(self.delete, sandbox.id)
        elif create:
            sandbox = await self._create("handle")
        else:
            raise ToolError("Pass the sandbox_id of an earlier result (this connection has no session).")
        sandbox.last_used = time.monotonic()
        return sandbox

    async def delete(self, sandbox_id: str) -> None:
        sandbox = self.sandboxes.pop(sandbox_id, None)
        if sandbox is None:
            return
        try:
            with anyio.CancelScope(shield=True), anyio.move_on_after(30):
                await sandbox.session.delete(missing_ok=True)
            log.info("sandbox %s deleted", sandbox_id)
        except Exception as exc:
            log.warning("could not delete sandbox %s: %s", sandbox_id, exc)

    def forget(self, sandbox_id: str) -> None:
        """Drop a sandbox whose session the gateway already ended."""
        self.sandboxes.pop(sandbox_id, None)

    async def delete_all(self) -> None:
        for sandbox_id in list(self.sandboxes):
            await self.delete(sandbox_id)

    async def reap_idle(self) -> None:
        """Delete handle-addressed sandboxes unused for ``idle_timeout`` seconds."""
        now = time.monotonic()
        for sandbox in list(self.sandboxes.values()):
            if sandbox.kind == "handle" and now - sandbox.last_used > self.idle_timeout:
                log.info("sandbox %s idle for %.0f s", sandbox.id, now - sandbox.last_used)
                await self.delete(sandbox.id)


# --------------------------------------------------------------------- results


def _text(text: str) -> TextContent:
    return TextContent(type="text", text=text)


def _result(sandbox: Sandbox, content: list[ContentBlock], *, is_error: bool = False) -> CallToolResult:
    if sandbox.kind == "handle":
        content = [
            *content,
            _text(f"sandbox_id: {sandbox.id} (pass it to the next calls to keep this sandbox's state)"),
        ]
    return CallToolResult(content=content, is_error=is_error, _meta={META_KEY: sandbox.id})


def _file_uri(path: str) -> str:
    from urllib.parse import quote

    return "file:///workspace/" + quote(path)


GATEWAY_FAILURES = (ClientError, httpx.HTTPError, OSError)


def _gateway_error(exc: BaseException, doing: str = "") -> ToolError:
    prefix = f"{doing}: " if doing else ""
    if isinstance(exc, ClientError):
        return ToolError(f"{prefix}{exc.code}: {exc.message}")
    return ToolError(f"{prefix}the kernelgw gateway did not answer ({type(exc).__name__}: {exc})")


def _session_ended(exc: BaseException) -> bool:
    return isinstance(exc, ClientError) and exc.status_code == 404 and exc.code == "session_not_found"


ENDED_NOTE = (
    "note: the previous sandbox had ended (idle timeout or a gateway restart); this is a new one, "
    "so earlier variables and files are gone."
)


# ---------------------------------------------------------------------- server


def create_server(
    server_url: str = DEFAULT_URL,
    *,
    single_client: bool = False,
    session_options: dict[str, Any] | None = None,
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
    headers: dict[str, str] | None = None,
    exec_timeout: float | None = None,
    kernel: str | None = None,
) -> MCPServer[Any]:
    """The MCP server, talking to the gateway at ``server_url``.

    ``kernel``: the sandboxes' language (python3, deno, ir, bash, java, go, cpp,
    ruby); the code tool is named for it (``run_python``, ``run_ruby``, ...).

    ``single_client``: the server serves one client (stdio), which gets one
    sandbox for the life of the process. ``session_options`` go to
    ``create_session`` (``memory_mb``, ``cpus``, ``timeout``, ...).
    """
    state: dict[str, SandboxRegistry] = {}
    text = tool_text(kernel)
    if kernel is not None:
        session_options = {"kernel": kernel, **(session_options or {})}

    @contextlib.asynccontextmanager
    async def lifespan(_: MCPServer[Any]) -> AsyncIterator[None]:
        async with AsyncClient(server_url, headers=headers) as client:
            registry = SandboxRegistry(
                client, single_client=single_client, session_options=session_options, idle_timeout=idle_timeout
            )
            state["registry"] = registry
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(_reaper, registry)
                    try:
                        yield
                    finally:
                        tg.cancel_scope.cancel()
            finally:
                with anyio.CancelScope(shield=True):
                    await registry.delete_all()

    server: MCPServer[Any] = MCPServer(
        "kernelgw",
        instructions=(
            f"A sandbox (a Jupyter kernel without network access). Run code with {text.name}: "
            f"{text.description} Move files in and out with upload_file / download_file; "
            "reset_session starts over."
        ),
        lifespan=lifespan,
        log_level="WARNING",
    )

    def registry() -> SandboxRegistry:
        return state["registry"]

    async def use(
        ctx: Context[Any, Any],
        sandbox_id: str | None,
        op: Callable[[AsyncSession], Awaitable[T]],
        *,
        create: bool = True,
    ) -> tuple[Sandbox, T, str | None]:
        """Run ``op`` on the call's sandbox: (sandbox, result, note for the model).

        A sandbox the gateway ended behind our back (its idle timeout, a gateway
        restart) is replaced by a new one, with a note, unless the call named it.
        """
        reg = registry()
        sandbox = await reg.get(ctx, sandbox_id, create=create)
        try:
            return sandbox, await op(sandbox.session), None
        except GATEWAY_FAILURES as exc:
            if not _session_ended(exc):
                raise _gateway_error(exc) from exc
            reg.forget(sandbox.id)
            if sandbox_id or sandbox.kind == "handle":
                raise ToolError(
                    f"The sandbox {sandbox.id!r} has ended (idle timeout or a gateway restart). "
                    "Call without sandbox_id to start a new one."
                ) from exc
        sandbox = await reg.get(ctx, None)
        try:
            return sandbox, await op(sandbox.session), ENDED_NOTE
        except GATEWAY_FAILURES as exc:
            raise _gateway_error(exc) from exc

    async def run_python(
        code: Annotated[str, Field(description=CODE_DESCRIPTION)],
        ctx: Context[Any, Any],
        timeout: Annotated[
            float | None, Field(description="Seconds before the execution is interrupted (default: the gateway's).")
        ] = None,
        sandbox_id: SandboxId = None,
    ) -> CallToolResult:
        effective = timeout if timeout is not None else exec_timeout
        sandbox, execution, note = await use(ctx, sandbox_id, lambda s: s.run(code, timeout=effective))
        obs = observe(execution)
        content: list[ContentBlock] = [_text(f"{note}\n{obs.text}" if note else obs.text)]
        content += [ImageContent(type="image", data=i.data, mime_type=i.mime_type) for i in obs.images]
        return _result(sandbox, content, is_error=obs.is_error)

    # the code argument is described for the kernel's language: an annotation that
    # names a local would not resolve (annotations are strings in this module)
    run_python.__annotations__["code"] = Annotated[str, Field(description=text.code_description)]
    server.tool(
        name=text.name,
        description=text.description,
        annotations=ToolAnnotations(
            title=text.name.replace("_", " ").capitalize(), read_only_hint=False, open_world_hint=False
        ),
        structured_output=False,
    )(run_python)

    @server.tool(
        name="upload_file",
        description="Write a file into the sandbox's working directory (parent directories are made; "
        "an existing file is replaced).",
        structured_output=False,
    )
    async def upload_file(
        path: Annotated[str, Field(description="Path relative to the working directory, e.g. 'data/sales.csv'.")],
        content: Annotated[str, Field(description="The file's content: text, or base64 with encoding='base64'.")],
        ctx: Context[Any, Any],
        encoding: Annotated[
            Literal["text", "base64"], Field(description="'text' (written as UTF-8) or 'base64' (binary files).")
        ] = "text",
        sandbox_id: SandboxId = None,
    ) -> CallToolResult:
        if encoding == "base64":
            try:
                data = base64.b64decode(content, validate=True)
            except ValueError as exc:
                raise ToolError(f"content is not valid base64: {exc}") from exc
        else:
            data = content.encode("utf-8")
        sandbox, result, note = await use(ctx, sandbox_id, lambda s: s.upload(data, path))
        verb = "created" if result.created else "replaced"
        return _result(sandbox, [_text(_noted(note, f"{verb} {result.path} ({result.size:,} bytes)"))])

    @server.tool(
        name="download_file",
        description="Read a file from the sandbox's working directory: images come back as images, "
        "text files as text, other files as base64.",
        annotations=ToolAnnotations(title="Download a file", read_only_hint=True),
        structured_output=False,
    )
    async def download_file(
        path: Annotated[str, Field(description="Path relative to the working directory.")],
        ctx: Context[Any, Any],
        sandbox_id: SandboxId = None,
    ) -> CallToolResult:
        async def fetch(session: AsyncSession) -> tuple[Any, bytes]:
            entries = {e.path: e for e in await session.files(_parent(path))}
            entry = entries.get(path.strip("/"))
            if entry is not None and entry.size > MAX_DOWNLOAD_BYTES:
                raise ToolError(f"{path} is {entry.size:,} bytes; the limit is {MAX_DOWNLOAD_BYTES:,}")
            data = await session.download(path)
            assert isinstance(data, bytes)
            return entry, data

        sandbox, (entry, data), note = await use(ctx, sandbox_id, fetch, create=False)
        mime = (entry.mime_type if entry is not None else None) or "application/octet-stream"
        summary = _text(_noted(note, f"{path} ({len(data):,} bytes, {mime})"))
        if mime in IMAGE_MIME_TYPES:
            image = ImageContent(type="image", data=base64.b64encode(data).decode(), mime_type=mime)
            return _result(sandbox, [summary, image])
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            resource: TextResourceContents | BlobResourceContents = BlobResourceContents(
                uri=_file_uri(path), mime_type=mime, blob=base64.b64encode(data).decode()
            )
        else:
            resource = TextResourceContents(uri=_file_uri(path), mime_type=mime, text=text)
        return _result(sandbox, [summary, EmbeddedResource(type="resource", resource=resource)])

    @server.tool(
        name="list_files",
        description="List the files in the sandbox's working directory (or a directory in it).",
        annotations=ToolAnnotations(title="List files", read_only_hint=True),
        structured_output=False,
    )
    async def list_files(
        ctx: Context[Any, Any],
        path: Annotated[str, Field(description="A directory relative to the working directory; '' for it.")] = "",
        recursive: bool = False,
        sandbox_id: SandboxId = None,
    ) -> CallToolResult:
        sandbox, entries, note = await use(ctx, sandbox_id, lambda s: s.files(path, recursive=recursive), create=False)
        if not entries:
            return _result(sandbox, [_text(_noted(note, f"{path or 'the working directory'} is empty"))])
        lines = [
            f"{e.path}{'/' if e.type == 'directory' else ''}\t{e.size:,} bytes\t{e.mtime:%Y-%m-%d %H:%M:%S}"
            for e in entries
        ]
        return _result(sandbox, [_text(_noted(note, "\n".join(lines)))])

    @server.tool(
        name="export_notebook",
        description="The sandbox's session so far as a Jupyter notebook (.ipynb JSON): one code cell per run "
        "with its outputs.",
        annotations=ToolAnnotations(title="Export notebook", read_only_hint=True),
        structured_output=False,
    )
    async def export_notebook(ctx: Context[Any, Any], sandbox_id: SandboxId = None) -> CallToolResult:
        sandbox, notebook, note = await use(ctx, sandbox_id, lambda s: s.export_notebook(), create=False)
        cells = notebook.get("cells", [])
        code_cells = sum(1 for c in cells if c.get("cell_type") == "code")
        resource = TextResourceContents(
            uri=f"file:///kernelgw-{sandbox.id}.ipynb",
            mime_type="application/x-ipynb+json",
            text=json.dumps(notebook, ensure_ascii=False),
        )
        return _result(
            sandbox,
            [
                _text(_noted(note, f"notebook with {code_cells} code cells")),
                EmbeddedResource(type="resource", resource=resource),
            ],
        )

    @server.tool(
        name="reset_session",
        description="Restart the sandbox's kernel: variables, imports and workspace files are lost.",
        annotations=ToolAnnotations(title="Reset", destructive_hint=True, idempotent_hint=True),
        structured_output=False,
    )
    async def reset_session(ctx: Context[Any, Any], sandbox_id: SandboxId = None) -> CallToolResult:
        sandbox, _, _note = await use(ctx, sandbox_id, lambda s: s.restart(), create=False)
        return _result(sandbox, [_text("The kernel was restarted: variables, imports and files are gone.")])

    del run_python, upload_file, download_file, list_files, export_notebook, reset_session
    return server


def _noted(note: str | None, text: str) -> str:
    return f"{note}\n{text}" if note else text


def _parent(path: str) -> str:
    path = path.strip("/")
    return path.rsplit("/", 1)[0] if "/" in path else ""


async def _reaper(registry: SandboxRegistry) -> None:
    interval = min(60.0, max(registry.idle_timeout / 4, 0.5))
    while True:
        await anyio.sleep(interval)
        await registry.reap_idle()


# ------------------------------------------------------------------ transports


def run_stdio(server_url: str = DEFAULT_URL, **options: Any) -> None:
    """Serve one client over stdin/stdout until stdin closes or SIGTERM / SIGINT."""
    import signal

    server = create_server(server_url, single_client=True, **options)

    async def main() -> None:
        async with anyio.create_task_group() as tg:

            async def on_signal() -> None:
                with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                    async for _ in signals:
                        tg.cancel_scope.cancel()
                        return

            tg.start_soon(on_signal)
            await server.run_stdio_async()
            tg.cancel_scope.cancel()

    anyio.run(main)


def http_app(server_url: str = DEFAULT_URL, *, host: str = "127.0.0.1", path: str = "/mcp", **options: Any) -> Any:
    """The streamable-HTTP server as an ASGI (Starlette) app; ``host`` is where it
    listens (loopback hosts get the SDK's DNS-rebinding protection)."""
    server = create_server(server_url, **options)
    return server.streamable_http_app(streamable_http_path=path, host=host)


def run_http(
    server_url: str = DEFAULT_URL, *, host: str = "127.0.0.1", port: int = 8100, path: str = "/mcp", **options: Any
) -> None:
    """Serve streamable HTTP at ``http://host:port/path`` until SIGTERM / SIGINT."""
    import uvicorn

    app = http_app(server_url, host=host, path=path, **options)
    uvicorn.run(app, host=host, port=port, log_level="warning")
