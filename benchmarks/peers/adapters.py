"""One class per peer, each a `Peer`: start() opens a session, run(code) -> Output, stop().

Every peer runs our kernel image (or the Kernel Gateway image built on it, see
`images`), so the Python, pandas and matplotlib are the same everywhere; what
differs is the system around the kernel and the limits it applies (read from
the containers while they run, see `limits`)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import tempfile
import time
import uuid
from importlib.metadata import version as _pkg_version
from pathlib import Path
from typing import Any

from .base import Output, Peer, error_name_from_text, output_from_v1_events
from .jupyter_ws import ChannelsClient, nodelay


def _version(pkg: str) -> str:
    try:
        return _pkg_version(pkg)
    except Exception:
        return "?"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ------------------------------------------------------------------- kernelgw


class KernelgwPeer(Peer):
    """A session on a running kernelgw gateway (warm pool as by default), over /v1: REST to
    create, the session's WebSocket to execute."""

    name = "kernelgw"
    setup = (
        "a gateway started by the benchmark with its defaults (warm pool of 2, runc); "
        "create = POST /v1/sessions, cells over the session's WebSocket"
    )

    def __init__(self, url: str) -> None:
        import httpx

        self.url = url
        self.http = httpx.Client(base_url=url, timeout=120)
        self.sid: str | None = None
        self.ws: Any = None

    def start(self) -> None:
        from websockets.sync.client import connect

        r = self.http.post("/v1/sessions", json={})
        r.raise_for_status()
        self.sid = r.json()["id"]
        ws_url = self.url.replace("http://", "ws://") + f"/v1/sessions/{self.sid}/ws"
        self.ws = connect(ws_url, max_size=None, compression=None)
        nodelay(self.ws)

    def run(self, code: str) -> Output:
        eid = uuid.uuid4().hex
        self.ws.send(json.dumps({"type": "execute", "code": code, "execution_id": eid}))
        events = []
        while True:
            event = json.loads(self.ws.recv(timeout=120))
            if event.get("execution_id") != eid:
                continue
            events.append(event)
            if event["type"] == "done":
                return output_from_v1_events(events)

    def stop(self) -> None:
        if self.ws is not None:
            with contextlib.suppress(Exception):
                self.ws.close()
            self.ws = None
        if self.sid is not None:
            self.http.delete(f"/v1/sessions/{self.sid}")
            self.sid = None

    def container_ids(self) -> list[str]:
        import docker

        client = docker.from_env()
        try:
            return [c.id for c in client.containers.list(filters={"label": f"kernelgw.session={self.sid}"})]
        finally:
            client.close()

    def version(self) -> str:
        return _version("kernelgw")

    def close(self) -> None:
        self.http.close()


# ------------------------------------------------------ stock Kernel Gateway


class StockKernelGateway:
    """``jupyter kernelgateway`` in one container of the peer image, as its docs run it
    (``docker run`` with nothing added; the host's network, so no docker-proxy sits
    between client and gateway: the floor). Shared by all stock sessions."""

    def __init__(self, image: str) -> None:
        self.image = image
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.container: Any = None

    def start(self) -> None:
        import docker
        import httpx

        client = docker.from_env()
        self.container = client.containers.run(
            self.image,
            [
                "/opt/kernel/bin/jupyter", "kernelgateway", "--KernelGatewayApp.ip=127.0.0.1",
                f"--KernelGatewayApp.port={self.port}", "--JupyterWebsocketPersonality.list_kernels=true",
            ],
            detach=True,
            network_mode="host",
            name=f"kgwb-peer-stock-kg-{self.port}",
            labels={"kernelgw.bench.peer": "stock-kernel-gateway"},
        )  # fmt: skip
        client.close()
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{self.url}/api", timeout=2).status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise RuntimeError("the stock Kernel Gateway did not start:\n" + self.container.logs().decode()[-2000:])
            time.sleep(0.1)

    def stop(self) -> None:
        if self.container is not None:
            with contextlib.suppress(Exception):
                self.container.remove(force=True)
            self.container = None


class StockKernelGatewayPeer(Peer):
    """A kernel on a running stock Kernel Gateway: POST /api/kernels, then its channels WebSocket."""

    name = "stock Kernel Gateway"
    setup = (
        "jupyter_kernel_gateway from PyPI in one container of the peer image, network host, "
        "nothing else added (the floor: no sandbox beyond the container); the gateway is "
        "running already, create = POST /api/kernels + the channels WebSocket"
    )

    def __init__(self, server: StockKernelGateway, kg_version: str) -> None:
        self.server = server
        self.kg_version = kg_version
        self.kernel_id: str | None = None
        self.client: ChannelsClient | None = None

    def start(self) -> None:
        import httpx

        r = httpx.post(f"{self.server.url}/api/kernels", json={"name": "python3"}, timeout=60)
        r.raise_for_status()
        self.kernel_id = r.json()["id"]
        ws = self.server.url.replace("http://", "ws://")
        self.client = ChannelsClient(f"{ws}/api/kernels/{self.kernel_id}/channels")

    def run(self, code: str) -> Output:
        assert self.client is not None
        return self.client.execute(code)

    def stop(self) -> None:
        import httpx

        if self.client is not None:
            self.client.close()
            self.client = None
        if self.kernel_id is not None:
            httpx.delete(f"{self.server.url}/api/kernels/{self.kernel_id}", timeout=60)
            self.kernel_id = None

    def container_ids(self) -> list[str]:
        return [self.server.container.id] if self.server.container is not None else []

    def version(self) -> str:
        return f"jupyter_kernel_gateway {self.kg_version}"


# ------------------------------------------------------------------- AutoGen


class AutoGenPeer(Peer):
    """AutoGen's DockerJupyterCodeExecutor on its own DockerJupyterServer (one container per
    executor, as its docs show), with ``custom_image_name`` set to the peer image."""

    name = "AutoGen DockerJupyterCodeExecutor"

    def __init__(self, image: str) -> None:
        self.image = image
        self.setup = (
            f"autogen-ext[docker-jupyter-executor] {_version('autogen-ext')}: DockerJupyterServer("
            "custom_image_name=<peer image>) + DockerJupyterCodeExecutor(server); its own container "
            "per executor, its defaults otherwise (bridge network, published port)"
        )
        self.loop = asyncio.new_event_loop()
        self.server: Any = None
        self.executor: Any = None
        self.outdir: str | None = None
        self.start_failures = 0
        """Starts whose first request met a Kernel Gateway not listening yet (retried)."""

    def start(self) -> None:
        from autogen_ext.code_executors.docker_jupyter import DockerJupyterCodeExecutor, DockerJupyterServer

        self.outdir = tempfile.mkdtemp(prefix="kgwb-autogen-")
        self.server = DockerJupyterServer(
            custom_image_name=self.image,
            container_name=f"kgwb-peer-autogen-{uuid.uuid4().hex[:12]}",
            stop_container=False,
        )
        self.executor = DockerJupyterCodeExecutor(jupyter_server=self.server, timeout=120, output_dir=Path(self.outdir))
        # DockerJupyterServer waits for the container to be "running", not for the Kernel
        # Gateway in it to listen: the executor's first request can meet a reset connection.
        # Counted (the report shows it) and retried, as a user would have to.
        deadline = time.monotonic() + 60
        while True:
            try:
                self.loop.run_until_complete(self.executor.start())
                return
            except Exception as exc:
                if "Connection" not in type(exc).__name__ + str(exc) or time.monotonic() > deadline:
                    raise
                self.start_failures += 1
                time.sleep(0.1)

    def run(self, code: str) -> Output:
        from autogen_core import CancellationToken
        from autogen_core.code_executor import CodeBlock

        res = self.loop.run_until_complete(
            self.executor.execute_code_blocks([CodeBlock(code=code, language="python")], CancellationToken())
        )
        out = Output()
        text = res.output or ""
        if res.exit_code != 0:
            # "ERROR: <ename>: <evalue>\n<traceback list>": the name is in the text only
            out.error = error_name_from_text(text) or "error"
            out.error_text = text
        else:
            # stdout and text/plain results arrive joined with "\n" in one string: the
            # text serves as both (a value that came back is not failed for the merge)
            out.stdout = text
            out.result = text or None
        for path in res.output_files:
            if str(path).endswith(".png"):
                out.images.append(Path(path).read_bytes())
        return out

    def stop(self) -> None:
        if self.executor is not None:
            with contextlib.suppress(Exception):
                self.loop.run_until_complete(self.executor.stop())
        if self.server is not None:
            with contextlib.suppress(Exception):
                self.loop.run_until_complete(self.server.stop())
            with contextlib.suppress(Exception):
                import docker

                client = docker.from_env()
                client.containers.get(self.server._container_id).remove(force=True)
                client.close()
        self.executor = self.server = None
        if self.outdir:
            import shutil

            shutil.rmtree(self.outdir, ignore_errors=True)
        self.loop.close()

    def container_ids(self) -> list[str]:
        return [self.server._container_id] if self.server is not None else []

    def version(self) -> str:
        return f"autogen-ext {_version('autogen-ext')}"


# ------------------------------------------------------------------ smolagents


class SmolagentsPeer(Peer):
    """smolagents' DockerExecutor (what ``CodeAgent(executor_type="docker")`` makes): a Kernel
    Gateway in its own container; ``image_name`` = the peer image, ``build_new_image=False``."""

    name = "smolagents DockerExecutor"

    def __init__(self, image: str) -> None:
        self.image = image
        self.setup = (
            f"smolagents[docker] {_version('smolagents')}: DockerExecutor(image_name=<peer image>, "
            "build_new_image=False) (the executor CodeAgent(executor_type='docker') makes); its own "
            "container per executor, its defaults otherwise (bridge network, published port); "
            "a new WebSocket per run, as it does"
        )
        self.executor: Any = None

    def start(self) -> None:
        from smolagents.monitoring import AgentLogger, LogLevel
        from smolagents.remote_executors import DockerExecutor

        self.executor = DockerExecutor(
            additional_imports=[],
            logger=AgentLogger(level=LogLevel.OFF),
            port=_free_port(),
            image_name=self.image,
            build_new_image=False,
            container_run_kwargs={"labels": {"kernelgw.bench.peer": "smolagents"}},
        )

    def run(self, code: str) -> Output:
        from smolagents.utils import AgentError

        out = Output()
        try:
            res = self.executor.run_code_raise_errors(code)
        except AgentError as exc:
            text = str(exc)
            out.error = error_name_from_text(text) or "error"
            out.error_text = text
            return out
        out.stdout = res.logs or ""
        out.result = None if res.output is None else str(res.output)
        return out

    def stop(self) -> None:
        if self.executor is not None:
            self.executor.cleanup()
            self.executor = None

    def container_ids(self) -> list[str]:
        c = getattr(self.executor, "container", None)
        return [c.id] if c is not None else []

    def version(self) -> str:
        return f"smolagents {_version('smolagents')}"


# ------------------------------------------------------------------ llm-sandbox


LLMSB_BANNER = "Python plot detection setup complete"


def strip_banner(text: str) -> str:
    """llm-sandbox's plot capture prints this line into every run's stdout (and stderr):
    it is the wrapper's, not the cell's, so it is taken out before the checks (the
    report says so)."""
    return "".join(line for line in text.splitlines(keepends=True) if line.rstrip("\n") != LLMSB_BANNER)


class LlmSandboxPeer(Peer):
    """llm-sandbox on our image, set up as bench_start/bench_exec do (`_common.llmsb_session`,
    `_common.llmsb_interactive`): stateless ArtifactSandboxSession (a fresh ``python`` per
    run, plots captured from plt.show()), or the interactive IPython runner."""

    def __init__(self, image: str, *, interactive: bool) -> None:
        self.image = image
        self.interactive = interactive
        self.stateful = interactive
        self.one_plus_one = "print(1+1)"  # a script has no displayhook
        self.name = "llm-sandbox interactive" if interactive else "llm-sandbox"
        v = _version("llm-sandbox")
        self.setup = (
            f"llm-sandbox[docker] {v}: InteractiveSandboxSession (IPython runner), "
            "environment setup skipped and its venv path linked to /opt/kernel (it cannot set up offline)"
            if interactive
            else f"llm-sandbox[docker] {v}: ArtifactSandboxSession (stateless: each run is a new python "
            "process in the same container), skip_environment_setup=True"
        ) + "; kernelgw's limits passed as runtime_configs (network none, memory, CPU, pids)"
        self.session: Any = None

    def start(self) -> None:
        from _common import llmsb_interactive, llmsb_session

        if self.interactive:
            self.session = llmsb_interactive(self.image)
        else:
            self.session = llmsb_session(self.image, artifacts=True)
        self.session.open()

    def run(self, code: str) -> Output:
        out = Output()
        res = self.session.run(code, clear_plots=True) if not self.interactive else self.session.run(code)
        out.stdout = strip_banner(res.stdout or "")
        stderr = strip_banner(res.stderr or "")
        if res.exit_code:
            text = stderr + out.stdout
            out.error = error_name_from_text(text) or f"exit {res.exit_code}"
            out.error_text = text
        elif stderr and error_name_from_text(stderr):
            out.error = error_name_from_text(stderr)
            out.error_text = stderr
        for plot in getattr(res, "plots", None) or []:
            out.images.append(base64.b64decode(plot.content_base64))
        return out

    def stop(self) -> None:
        if self.session is not None:
            with contextlib.suppress(Exception):
                self.session.close()
            self.session = None

    def container_ids(self) -> list[str]:
        # its Docker session's container: ArtifactSandboxSession wraps one in `_session`,
        # InteractiveSandboxSession is one (`_backend_session`)
        inner = getattr(self.session, "_session", None) or getattr(self.session, "_backend_session", None)
        container = getattr(inner, "container", None)
        return [container.id] if container is not None else []

    def version(self) -> str:
        return f"llm-sandbox {_version('llm-sandbox')}"
