"""E2B's code-interpreter SDK (sync and async, unchanged) against the /e2b sandbox
routes of a real gateway (uvicorn on loopback, keys required) on kernel
subprocesses. Sandboxes are sessions made through the manager with an access
token, as the control plane makes them; the SDK's objects are built from their
id and token as ``Sandbox.connect`` builds them."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import secrets
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import uvicorn
from e2b import ConnectionConfig, NotFoundException, SandboxException, TimeoutException
from e2b_code_interpreter import AsyncSandbox, Sandbox
from packaging.version import Version

from kernelgw.runtime.manager import MAX_CHILDREN, SessionOptions
from kernelgw.runtime.session import KernelSession
from kernelgw.server import create_app
from kernelgw.server.e2b import ndjson
from kernelgw.server.e2b.interpreter import default_context
from kernelgw.server.e2b.sandbox import NOT_FOUND_MESSAGE
from kernelgw.server.serving import uvicorn_config
from kernelgw.server.state import GatewayState, find_gateway_state
from tests.support.app import local_settings
from tests.support.local_backend import LocalBackend
from tests.support.waiting import until
from tests.unit.server.jupyter.conftest import make_keys

T = TypeVar("T")
WAIT_S = 60


@dataclass
class Gateway:
    url: str
    """E2B_SANDBOX_URL: the face's base URL."""
    state: GatewayState
    key: str

    async def sandbox(self, **options: Any) -> tuple[KernelSession, str]:
        """A session of the key's with an access token, as the control plane makes one."""
        token = secrets.token_urlsafe(32)
        principal = await self.state.auth.from_key(self.key)
        opts = SessionOptions(access_sha256=hashlib.sha256(token.encode()).hexdigest(), **options)
        return await self.state.manager.create(opts, principal), token

    def config(self, session: KernelSession, token: str) -> ConnectionConfig:
        headers = {"E2b-Sandbox-Id": session.id, "E2b-Sandbox-Port": "49983", "X-Access-Token": token}
        return ConnectionConfig(
            api_key=self.key, api_url=self.url, sandbox_url=self.url, http_version="1.1", extra_sandbox_headers=headers
        )

    def sdk(self, session: KernelSession, token: str) -> Sandbox:
        return Sandbox(
            sandbox_id=session.id,
            sandbox_domain=None,
            envd_version=Version("0.5.0"),
            envd_access_token=token,
            traffic_access_token=token,
            connection_config=self.config(session, token),
        )

    def async_sdk(self, session: KernelSession, token: str) -> AsyncSandbox:
        return AsyncSandbox(
            sandbox_id=session.id,
            sandbox_domain=None,
            envd_version=Version("0.5.0"),
            envd_access_token=token,
            traffic_access_token=token,
            connection_config=self.config(session, token),
        )

    def headers(self, session: KernelSession, token: str, port: int = 49999) -> dict[str, str]:
        return {"E2b-Sandbox-Id": session.id, "E2b-Sandbox-Port": str(port), "X-Access-Token": token}


@asynccontextmanager
async def serve(tmp: Path, backend: LocalBackend, **overrides: Any) -> AsyncIterator[Gateway]:
    data_dir = tmp / "gw"
    data_dir.mkdir()
    (key,) = await make_keys(data_dir, "alice")
    settings = local_settings(data_dir, auth="required", **overrides)
    app = create_app(settings, backend=backend)
    server = uvicorn.Server(uvicorn_config(app, settings, host="127.0.0.1", port=0, log_level="warning", lifespan="on"))
    task = asyncio.create_task(server.serve())
    try:
        await until(_started(server, task), "uvicorn to start")
        host, port = server.servers[0].sockets[0].getsockname()[:2]
        state = find_gateway_state(app)
        assert state is not None
        yield Gateway(f"http://{host}:{port}/e2b", state, key)
    finally:
        server.should_exit = True
        await task


def _started(server: uvicorn.Server, task: asyncio.Task[None]) -> Callable[[], Any]:
    async def started() -> bool:
        assert not task.done(), "uvicorn stopped before it started"
        return server.started

    return started


@pytest.fixture(scope="module")
async def gw(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Gateway]:
    backend = LocalBackend()
    try:
        async with serve(tmp_path_factory.mktemp("e2b"), backend) as gateway:
            yield gateway
        assert not backend.running(), f"kernel processes left running: {backend.running()}"
    finally:
        await backend.kill_all()


async def in_thread(call: Callable[[], T]) -> T:
    """The sync SDK blocks: it runs beside the gateway's loop, not on it."""
    async with asyncio.timeout(WAIT_S):
        return await asyncio.to_thread(call)


def done_statuses(session: KernelSession) -> list[str]:
    events = [json.loads(text) for _, text in session.events_since(0)]
    return [e["status"] for e in events if e["type"] == "done"]


# ---------------------------------------------------------------- running code
async def test_sync_run_code_returns_the_value_and_keeps_state(gw: Gateway, sandbox: tuple[KernelSession, str]) -> None:
    sbx = gw.sdk(*sandbox)
    assert (await in_thread(lambda: sbx.run_code("1+1"))).text == "2"
    await in_thread(lambda: sbx.run_code("x = 40"))
    execution = await in_thread(lambda: sbx.run_code("x + 2"))
    assert execution.text == "42"
    assert execution.execution_count == 3
    assert execution.error is None


async def test_async_run_code_streams_stdout_and_stderr_to_callbacks(
    gw: Gateway, sandbox: tuple[KernelSession, str]
) -> None:
    sbx = gw.async_sdk(*sandbox)
    out: list[str] = []
    err: list[str] = []

    async def on_stderr(message: Any) -> None:
        err.append(message.line)

    code = "import sys\nprint('one', flush=True)\nprint('two', file=sys.stderr, flush=True)\n'done'"
    execution = await sbx.run_code(code, on_stdout=lambda m: out.append(m.line), on_stderr=on_stderr)
    assert (out, err) == (["one\n"], ["two\n"])
    assert execution.logs.stdout == ["one\n"] and execution.logs.stderr == ["two\n"]
    assert execution.text == "done"


async def test_an_error_has_its_name_value_and_traceback(gw: Gateway, sandbox: tuple[KernelSession, str]) -> None:
    sbx = gw.async_sdk(*sandbox)
    errors: list[Any] = []
    execution = await sbx.run_code("def f():\n    return 1/0\nf()", on_error=errors.append)
    assert execution.error is not None
    assert (execution.error.name, execution.error.value) == ("ZeroDivisionError", "division by zero")
    plain = re.sub(r"\x1b\[[0-9;]*m", "", execution.error.traceback)  # as E2B sends it: with the kernel's colours
    assert "return 1/0" in plain and "ZeroDivisionError: division by zero" in plain
    assert errors == [execution.error]
    assert execution.text is None


async def test_output_streams_before_the_cell_ends(gw: Gateway, sandbox: tuple[KernelSession, str]) -> None:
    lines: list[str] = []
    seen = asyncio.Event()

    def on_stdout(message: Any) -> None:
        lines.append(message.line)
        seen.set()

    code = (
        "import os, time\nprint(os.getcwd(), flush=True)\nwhile not os.path.exists('release'): time.sleep(0.05)\n'end'"
    )
    run = asyncio.create_task(gw.async_sdk(*sandbox).run_code(code, on_stdout=on_stdout))
    async with asyncio.timeout(WAIT_S):
        await seen.wait()
    assert not run.done()  # the cell waits for a file the test creates only now
    (Path(lines[0].strip()) / "release").touch()
    async with asyncio.timeout(WAIT_S):
        assert (await run).text == "end"


async def test_displays_and_the_value_bring_every_mime_type(gw: Gateway, sandbox: tuple[KernelSession, str]) -> None:
    sbx = gw.async_sdk(*sandbox)
    code = (
        "%matplotlib inline\nimport matplotlib.pyplot as plt\n"
        "plt.plot([1, 2, 3])\nplt.title('rising')\nplt.show()\n"
        "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})"
    )
    execution = await sbx.run_code(code)
    figure, frame = execution.results
    assert figure.png and not figure.is_main_result
    assert figure.chart is not None and (figure.chart.type.value, figure.chart.title) == ("line", "rising")
    assert frame.is_main_result and frame.html is not None and "<table" in frame.html
    assert frame.text is not None and "a  b" in frame.text
    assert frame.data == {"a": [1, 2], "b": ["x", "y"]}
    execution = await sbx.run_code(
        "from IPython.display import display, JSON, Markdown, Latex\n"
        "display(JSON({'k': [1]}), Markdown('**m**'), Latex('$x$'))"
    )
    assert execution.results[0].json == {"k": [1]}
    assert execution.results[1].markdown == "**m**"
    assert execution.results[2].latex == "$x$"


async def test_env_vars_hold_for_one_execution(gw: Gateway, sandbox: tuple[KernelSession, str]) -> None:
    sbx = gw.async_sdk(*sandbox)
    read = "import os; str(os.environ.get('E2B_CELL_VAR'))"
    assert (await sbx.run_code(read, envs={"E2B_CELL_VAR": "secret"})).text == "secret"
    assert (await sbx.run_code(read)).text == "None"
    # the face applies the environment rules of every face
    with pytest.raises(SandboxException, match="LD_PRELOAD"):
        await sbx.run_code(read, envs={"LD_PRELOAD": "/x.so"})


async def test_the_sdk_timeout_interrupts_the_cell_and_the_next_one_runs(
    gw: Gateway, sandbox: tuple[KernelSession, str]
) -> None:
    session, token = sandbox
    sbx = gw.sdk(session, token)
    with pytest.raises(TimeoutException, match="Execution timed out"):
        await in_thread(lambda: sbx.run_code("import time; time.sleep(600)", timeout=1))

    await until(_interrupted(session, 1), "the abandoned cell to be interrupted")  # not left to run its 600 s
    assert (await in_thread(lambda: sbx.run_code("'next'"))).text == "next"


async def test_a_queued_cell_whose_client_left_is_interrupted_when_it_starts(
    gw: Gateway, sandbox: tuple[KernelSession, str]
) -> None:
    session, token = sandbox
    session.submit("import time\nprint('blocking', flush=True)\ntime.sleep(600)")
    await until(_printed(session, "blocking"), "the cell ahead to run")
    async with httpx.AsyncClient(base_url=gw.url, timeout=WAIT_S) as http:
        body = {"code": "import time; time.sleep(600)"}
        async with http.stream("POST", "/execute", json=body, headers=gw.headers(session, token)) as response:
            assert response.status_code == 200
    # its client went away while the cell was queued; the cell ahead ends
    assert await session.interrupt()
    await until(_interrupted(session, 2), "the queued cell to be interrupted once it started")
    assert session.queue_length == 0


def _printed(session: KernelSession, text: str) -> Callable[[], Any]:
    async def check() -> bool:
        events = [json.loads(t) for _, t in session.events_since(0)]
        return any(e["type"] == "stream" and text in e["text"] for e in events)

    return check


def _interrupted(session: KernelSession, count: int) -> Callable[[], Any]:
    async def check() -> bool:
        return done_statuses(session).count("interrupted") == count

    return check


async def test_a_gateway_timeout_is_an_error_the_sdk_reads(gw: Gateway) -> None:
    session, token = await gw.sandbox(timeout=1.0)
    try:
        execution = await gw.async_sdk(session, token).run_code("import time; time.sleep(600)")
        assert execution.error is not None
        assert execution.error.name == ndjson.EXECUTION_TIMEOUT
        assert "timeout of 1s" in execution.error.value
        assert (await gw.async_sdk(session, token).run_code("'alive'")).text == "alive"
    finally:
        await gw.state.manager.delete(session.id)


async def test_output_past_the_subscribers_queue_comes_whole(tmp_path: Path, local_backend: LocalBackend) -> None:
    # a stream consumer that falls behind its subscription is sent the rest from the cell's record
    async with serve(tmp_path, local_backend, subscriber_queue=4) as gateway:
        session, token = await gateway.sandbox()
        code = "for i in range(300):\n    print(i, flush=True)"
        execution = await gateway.async_sdk(session, token).run_code(code)
        assert "".join(execution.logs.stdout) == "".join(f"{i}\n" for i in range(300))
        assert execution.error is None
        await gateway.state.manager.delete(session.id)


async def test_a_drain_ends_the_stream_as_e2b_unexpected_end(tmp_path: Path, local_backend: LocalBackend) -> None:
    async with serve(tmp_path, local_backend) as gateway:
        session, token = await gateway.sandbox()
        started = asyncio.Event()
        sbx = gateway.async_sdk(session, token)
        run = asyncio.create_task(
            sbx.run_code("import time\nprint('go', flush=True)\ntime.sleep(600)", on_stdout=lambda m: started.set())
        )
        async with asyncio.timeout(WAIT_S):
            await started.wait()
        gateway.state.drain.close()
        async with asyncio.timeout(WAIT_S):
            execution = await run
        assert execution.error is not None and execution.error.name == ndjson.UNEXPECTED_END
        assert "restarting" in execution.error.value
        assert session.current_execution is not None  # left running: the shutdown decides the kernel's fate
        await gateway.state.manager.delete(session.id)


# ---------------------------------------------------------------- contexts and languages
async def test_the_default_context_is_listed_and_restarts(gw: Gateway, sandbox: tuple[KernelSession, str]) -> None:
    session, token = sandbox
    sbx = gw.async_sdk(session, token)
    (context,) = await sbx.list_code_contexts()
    assert (context.id, context.language) == (default_context(session).id, "python")
    await sbx.run_code("kept = 1")
    assert (await sbx.run_code("kept", context=context)).text == "1"
    await sbx.restart_code_context(context)
    assert (await sbx.run_code("'kept' in dir()", language="python")).text == "False"
    assert [c.id for c in await sbx.list_code_contexts()] == [context.id]  # the same across restarts


async def test_a_new_context_is_a_kernel_of_its_own_sharing_the_files(
    gw: Gateway, sandbox: tuple[KernelSession, str]
) -> None:
    session, token = sandbox
    sbx = gw.async_sdk(session, token)
    await sbx.run_code("x = 'default'\nopen('shared.txt', 'w').write('from the default')")
    ctx = await sbx.create_code_context(language="python")
    assert ctx.language == "python" and ctx.cwd == "/home/user"
    assert (await sbx.run_code("'x' in dir()", context=ctx)).text == "False"  # variables apart
    assert (await sbx.run_code("open('shared.txt').read()", context=ctx)).text == "from the default"
    await sbx.run_code("x = 'ctx'", context=ctx)
    assert (await sbx.run_code("x")).text == "default"
    listed = await sbx.list_code_contexts()
    assert [c.id for c in listed] == [default_context(session).id, ctx.id]
    assert gw.state.manager.list() and ctx.id not in {s.id for s in gw.state.manager.list()}  # not a session
    # a restart of the context: its variables go, the default's stay
    await sbx.restart_code_context(ctx)
    assert (await sbx.run_code("'x' in dir()", context=ctx)).text == "False"
    assert (await sbx.run_code("x")).text == "default"
    await sbx.remove_code_context(ctx)
    with pytest.raises(NotFoundException, match=f"Context {ctx.id} ended: removed"):
        await sbx.run_code("1", context=ctx)
    assert [c.id for c in await sbx.list_code_contexts()] == [default_context(session).id]


async def test_contexts_end_with_the_sandboxs_kernel_and_say_why(
    gw: Gateway, sandbox: tuple[KernelSession, str]
) -> None:
    session, token = sandbox
    sbx = gw.async_sdk(session, token)
    ctx = await sbx.create_code_context()
    (child,) = session.children
    await sbx.restart_code_context(default_context(session).id)
    assert child.state == "closed" and session.children == ()
    with pytest.raises(NotFoundException, match="main kernel was restarted"):
        await sbx.run_code("1", context=ctx)
    ctx = await sbx.create_code_context()
    (child,) = session.children
    await gw.state.manager.delete(session.id)
    assert child.state == "closed"


async def test_languages_the_image_lacks_are_refused_naming_templates(
    gw: Gateway, sandbox: tuple[KernelSession, str]
) -> None:
    sbx = gw.async_sdk(*sandbox)
    for call in (
        lambda: sbx.create_code_context(language="javascript"),
        lambda: sbx.run_code("1", language="r"),
    ):
        with pytest.raises(SandboxException, match=r"400.*does not hold.*e2b_templates setting"):
            await call()
    with pytest.raises(SandboxException, match=r"400.*'cobol' is not one E2B"):
        await sbx.run_code("1", language="cobol")
    with pytest.raises(NotFoundException, match="Context nope not found"):
        await sbx.run_code("1", context=type("C", (), {"id": "nope"})())  # type: ignore[arg-type]
    (context,) = await sbx.list_code_contexts()
    with pytest.raises(SandboxException, match="cannot be removed"):
        await sbx.remove_code_context(context)


async def test_contexts_are_bounded_per_sandbox(gw: Gateway, sandbox: tuple[KernelSession, str]) -> None:
    session, token = sandbox
    sbx = gw.async_sdk(session, token)
    for _ in range(MAX_CHILDREN):
        await sbx.create_code_context()
    with pytest.raises(SandboxException, match=rf"429.*maximum of {MAX_CHILDREN} contexts"):
        await sbx.create_code_context()
    assert len(session.children) == MAX_CHILDREN


# ---------------------------------------------------------------- access
async def test_a_wrong_token_and_an_unknown_id_get_the_same_answer(
    gw: Gateway, sandbox: tuple[KernelSession, str]
) -> None:
    session, token = sandbox
    right = gw.headers(session, token)
    async with httpx.AsyncClient(base_url=gw.url, timeout=WAIT_S) as http:
        answers = []
        for headers in (
            {**right, "X-Access-Token": "not-the-token"},
            {k: v for k, v in right.items() if k != "X-Access-Token"},
            {**right, "X-Access-Token": token[:-1]},
        ):
            response = await http.post("/execute", json={"code": "1"}, headers=headers)
            answers.append((response.status_code, response.json()["message"]))
        unknown = {**right, "E2b-Sandbox-Id": "00000000-0000-0000-0000-000000000000"}
        response = await http.post("/execute", json={"code": "1"}, headers=unknown)
        answers.append((response.status_code, response.json()["message"]))
        assert answers == [(502, NOT_FOUND_MESSAGE)] * 4
        # the token works as E2B's traffic token too (the SDK's context calls send only that)
        traffic = {**right, "E2B-Traffic-Access-Token": token}
        del traffic["X-Access-Token"]
        assert (await http.get("/contexts", headers=traffic)).status_code == 200
        closed = await http.post("/execute", json={"code": "1"}, headers={**right, "E2b-Sandbox-Port": "8080"})
        assert (closed.status_code, closed.json()["message"]) == (502, "The sandbox is running but port is not open")
    assert done_statuses(session) == []  # nothing ran


async def test_is_running_until_the_sandbox_is_killed(gw: Gateway) -> None:
    session, token = await gw.sandbox()
    sync, asynchronous = gw.sdk(session, token), gw.async_sdk(session, token)
    assert await in_thread(sync.is_running)
    assert await asynchronous.is_running()
    await gw.state.manager.delete(session.id)
    assert not await in_thread(sync.is_running)
    assert not await asynchronous.is_running()
