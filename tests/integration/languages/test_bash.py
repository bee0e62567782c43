"""The Bash kernel (bash_kernel behind kernelgw_kernel.bash_launcher and the
shim) in a container started by the gateway's own backend, with the gateway's
options: the agent demo's four tasks, state between cells, errors with their
message, an interrupt, stdout and stderr streamed apart, rich displays, an
artifact, and nothing left behind.

The image comes from ``KERNELGW_IMAGE_BASH`` (default ``kernelgw/bash:latest``);
when it is missing the tests fail and say how to build it.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import pytest
from jupyter_client import BlockingKernelClient

from kernelgw.config import Settings
from kernelgw.runtime.backends import KernelHandle, KernelSpec, create_backend

pytestmark = pytest.mark.integration

IMAGE = os.environ.get("KERNELGW_IMAGE_BASH", "kernelgw/bash:latest")
RUNTIME = os.environ.get("KERNELGW_TEST_RUNTIME", "runc")
ARTIFACTS = {"artifacts": "__import__('kernelgw_kernel').artifacts()"}
PNG_1PX = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="


# ------------------------------------------------------------------ harness
@dataclass
class Cell:
    """One execute_request's iopub messages (with arrival times) and reply."""

    reply: dict[str, Any]
    messages: list[tuple[float, dict[str, Any]]] = field(default_factory=list)

    def of_type(self, *types: str) -> list[dict[str, Any]]:
        return [m["content"] for _, m in self.messages if m["msg_type"] in types]

    def stream(self, name: str) -> str:
        return "".join(c["text"] for c in self.of_type("stream") if c["name"] == name)

    def arrival(self, name: str, text: str) -> float:
        """When the first ``name`` stream message holding ``text`` arrived."""
        for t, m in self.messages:
            if m["msg_type"] == "stream" and m["content"]["name"] == name and text in m["content"]["text"]:
                return t
        raise AssertionError(f"no {name} stream with {text!r}: {self.messages}")

    @property
    def displays(self) -> list[dict[str, Any]]:
        return [c["data"] for c in self.of_type("display_data", "execute_result")]

    @property
    def artifacts(self) -> list[dict[str, Any]]:
        found = self.reply["user_expressions"]["artifacts"]
        assert found["status"] == "ok", found
        return json.loads(found["data"]["text/plain"])  # type: ignore[no-any-return]


@dataclass
class Kernel:
    backend: Any
    handle: KernelHandle
    kc: BlockingKernelClient
    started_in: float

    def execute(self, code: str, *, timeout: float = 60, interrupt_after: float | None = None) -> Cell:
        """Run ``code`` as the gateway does (with its artifacts expression); with
        ``interrupt_after``, SIGINT the container that long after the cell began."""
        msg_id = self.kc.execute(code, user_expressions=ARTIFACTS)
        sent = time.monotonic()
        deadline = sent + timeout
        cell = Cell(reply={})
        interrupted = interrupt_after is None
        while True:
            now = time.monotonic()
            assert now < deadline, f"no idle within {timeout} s: {cell.messages}"
            if not interrupted and now - sent >= interrupt_after:  # type: ignore[operator]
                asyncio.run(self.backend.signal(self.handle, signal.SIGINT))
                interrupted = True
            try:
                msg = self.kc.get_iopub_msg(timeout=0.1)
            except Exception:  # queue.Empty
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "status":
                if msg["content"]["execution_state"] == "idle":
                    break
                continue
            if msg["msg_type"] != "execute_input":
                cell.messages.append((time.monotonic() - sent, msg))
        while True:
            reply = self.kc.get_shell_msg(timeout=max(1.0, deadline - time.monotonic()))
            if reply["parent_header"].get("msg_id") == msg_id:
                cell.reply = reply["content"]
                return cell


def labelled(client: docker.DockerClient, gateway_name: str) -> list[str]:
    label = {"label": f"kernelgw.gateway={gateway_name}"}
    return [c.name for c in client.containers.list(all=True, filters=label)] + [
        f"volume {v.name}" for v in client.volumes.list(filters=label)
    ]


@pytest.fixture(scope="module")
def engine() -> Iterator[docker.DockerClient]:
    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as exc:
        pytest.fail(f"No Docker engine answers ({exc}); run scripts/ensure-docker.sh", pytrace=False)
    try:
        client.images.get(IMAGE)
    except docker.errors.ImageNotFound:
        pytest.fail(
            f"Kernel image {IMAGE} missing; build it with `kernelgw image build --kernel bash` "
            "(or set KERNELGW_IMAGE_BASH to a built tag)",
            pytrace=False,
        )
    yield client
    client.close()


@contextmanager
def started_kernel(client: docker.DockerClient) -> Iterator[Kernel]:
    """A kernel started as the gateway starts one (its backend, default options,
    sealed after its first kernel_info reply); afterwards nothing of it is left."""
    settings = Settings(gateway_name=f"lb{os.getpid()}{uuid.uuid4().hex[:4]}", runtime_dir=Path("/tmp/kgwt"))
    backend = create_backend(settings)
    spec = KernelSpec(
        session_id=uuid.uuid4().hex[:12],
        image=IMAGE,
        memory_mb=512,
        cpus=settings.cpus,
        pids_limit=settings.pids_limit,
        tmp_size_mb=settings.tmp_size_mb,
        workspace_size_mb=settings.workspace_size_mb,
        shm_size_mb=settings.shm_size_mb,
        packages_size_mb=settings.packages_size_mb,
        runtime=RUNTIME,
    )
    started = time.monotonic()
    handle = asyncio.run(backend.start(spec))
    kc = BlockingKernelClient()
    logs = ""
    try:
        kc.load_connection_info(handle.connection)
        kc.start_channels(hb=False)
        kc.wait_for_ready(timeout=60)
        took = time.monotonic() - started
        asyncio.run(backend.seal(handle))
        yield Kernel(backend, handle, kc, took)
    finally:
        kc.stop_channels()
        try:
            logs = client.containers.get(handle.container_id).logs().decode(errors="replace")
        except docker.errors.NotFound:
            pass
        asyncio.run(backend.stop(handle))
        asyncio.run(backend.end_session(spec.session_id))
        asyncio.run(backend.close())
    assert not labelled(client, settings.gateway_name), "left behind"
    assert not handle.conn_dir.exists(), "connection directory left behind"
    assert "Traceback" not in logs, logs


@pytest.fixture(scope="module")
def kernel(engine: docker.DockerClient) -> Iterator[Kernel]:
    with started_kernel(engine) as k:
        yield k


def ok(cell: Cell) -> Cell:
    assert cell.reply["status"] == "ok", (cell.reply, cell.messages)
    return cell


# ------------------------------------------------------------- the demo tasks
def test_pi_by_monte_carlo(kernel: Kernel) -> None:
    cell = ok(
        kernel.execute(
            "n=20000; hits=0\n"
            "for ((i = 0; i < n; i++)); do\n"
            "  x=$RANDOM; y=$RANDOM\n"
            "  (( x * x + y * y <= 32767 * 32767 )) && (( hits++ ))\n"
            "done\n"
            "printf '%d.%04d\\n' $(( 4 * hits / n )) $(( 4 * hits * 10000 / n % 10000 ))"
        )
    )
    assert 3.0 < float(cell.stream("stdout").strip()) < 3.3, cell.stream("stdout")


def test_factorial_of_10(kernel: Kernel) -> None:
    cell = ok(kernel.execute("f=1; for i in {1..10}; do (( f *= i )); done; echo $f"))
    assert cell.stream("stdout") == "3628800\n"


def test_first_ten_fibonacci_numbers(kernel: Kernel) -> None:
    cell = ok(
        kernel.execute(
            'a=0; b=1; fib=()\nfor i in {1..10}; do fib+=($a); t=$((a + b)); a=$b; b=$t; done\necho "${fib[@]}"'
        )
    )
    assert cell.stream("stdout") == "0 1 1 2 3 5 8 13 21 34\n"


def test_sum_of_1_to_10000(kernel: Kernel) -> None:
    cell = ok(kernel.execute("s=0; for ((i = 1; i <= 10000; i++)); do (( s += i )); done; echo $s"))
    assert cell.stream("stdout") == "50005000\n"


# ---------------------------------------------------------- the shell's ways
def test_variables_functions_and_cwd_persist_between_cells(kernel: Kernel) -> None:
    ok(kernel.execute('answer=41\ngreet() { echo "hello $1"; }\ncd /tmp && mkdir -p sub && cd sub'))
    cell = ok(kernel.execute('echo $((answer + 1)) "$PWD"; greet bash'))
    assert cell.stream("stdout") == "42 /tmp/sub\nhello bash\n"
    ok(kernel.execute("cd /workspace"))


def test_a_failing_command_is_an_error_with_its_message_and_status(kernel: Kernel) -> None:
    cell = kernel.execute("echo before; ls /no/such/dir")
    assert cell.reply["status"] == "error"
    assert cell.stream("stdout") == "before\n"
    assert "No such file or directory" in cell.stream("stderr")
    (error,) = cell.of_type("error")
    assert error["ename"] == cell.reply["ename"] == "ExitStatus"
    assert "ls: cannot access '/no/such/dir': No such file or directory" in error["evalue"]
    assert "exit status 2" in error["evalue"]
    assert error["traceback"] and "exit status 2" in error["traceback"][-1]

    missing = kernel.execute("no_such_command_here")
    assert missing.reply["status"] == "error"
    assert "command not found" in missing.reply["evalue"] and "exit status 127" in missing.reply["evalue"]

    # only the last command's status counts, as in a script
    assert ok(kernel.execute("false; echo fine")).stream("stdout") == "fine\n"
    assert kernel.execute("true; false").reply["evalue"] == "exit status 1"


def test_incomplete_input_is_an_error_and_nothing_of_the_cell_runs(kernel: Kernel) -> None:
    cell = kernel.execute('touch /tmp/ran-incomplete\necho "no closing quote')
    assert cell.reply["status"] == "error" and cell.reply["ename"] == "IncompleteInput", cell.reply
    after = ok(kernel.execute("ls /tmp/ran-incomplete 2>/dev/null; echo still working"))
    assert after.stream("stdout") == "still working\n"


def test_stdout_and_stderr_stream_apart_as_they_come(kernel: Kernel) -> None:
    cell = ok(kernel.execute("echo out-1; echo err-1 >&2; sleep 1.5; echo out-2; echo err-2 >&2"))
    assert cell.stream("stdout") == "out-1\nout-2\n"
    assert cell.stream("stderr") == "err-1\nerr-2\n"
    # the first lines came before the sleep ended, not at the end of the cell
    assert cell.arrival("stdout", "out-2") - cell.arrival("stdout", "out-1") > 1.0
    assert cell.arrival("stderr", "err-2") - cell.arrival("stderr", "err-1") > 1.0
    partial = ok(kernel.execute("printf 'no newline' >&2"))
    assert partial.stream("stderr") == "no newline"


def test_sigint_interrupts_an_endless_loop_and_the_kernel_goes_on(kernel: Kernel) -> None:
    ok(kernel.execute("kept=yes"))
    cell = kernel.execute("while true; do :; done", interrupt_after=1.0, timeout=30)
    assert cell.reply["status"] == "error" and cell.reply["ename"] == "KeyboardInterrupt", cell.reply
    assert any(e["ename"] == "KeyboardInterrupt" for e in cell.of_type("error"))
    # a program the loop was running is interrupted too
    sleeping = kernel.execute("sleep 100; echo not reached", interrupt_after=1.0, timeout=30)
    assert sleeping.reply["ename"] == "KeyboardInterrupt"
    assert "not reached" not in sleeping.stream("stdout")
    assert ok(kernel.execute('echo "still $kept"')).stream("stdout") == "still yes\n"


def test_display_helpers_show_png_and_html(kernel: Kernel) -> None:
    cell = ok(kernel.execute(f"printf '%s' '{PNG_1PX}' | base64 -d | display\necho '<b>bold</b>' | displayHTML"))
    png, html = cell.displays
    assert base64.b64decode(png["image/png"]).startswith(b"\x89PNG")
    assert html["text/html"].strip() == "<b>bold</b>"


def test_a_chart_drawn_by_a_program_displays_as_png(kernel: Kernel) -> None:
    # the image's Python (with matplotlib) is on PATH
    cell = ok(
        kernel.execute(
            "python3 - <<'EOF' | display\n"
            "import sys, matplotlib\n"
            "matplotlib.use('agg')\n"
            "import matplotlib.pyplot as plt\n"
            "plt.plot([1, 4, 9, 16])\n"
            "plt.savefig(sys.stdout.buffer, format='png')\n"
            "EOF",
            timeout=120,
        )
    )
    (chart,) = cell.displays
    assert len(base64.b64decode(chart["image/png"])) > 5000


def test_a_file_written_to_the_workspace_is_an_artifact(kernel: Kernel) -> None:
    cell = ok(kernel.execute("printf 'a,b\\n1,2\\n' > /workspace/table.csv"))
    assert {"path": "table.csv", "size": 8, "mime_type": "text/csv", "change": "created"} in cell.artifacts
    assert ok(kernel.execute("echo unchanged")).artifacts == []


def test_many_lines_run_without_pexpect_delays(kernel: Kernel) -> None:
    """pexpect's 50 ms before each write made a cell of 40 lines take 4 s."""
    code = "\n".join(f"v{i}={i}" for i in range(40)) + "\necho $v39"
    started = time.monotonic()
    cell = ok(kernel.execute(code))
    assert cell.stream("stdout") == "39\n"
    assert time.monotonic() - started < 1.5


def test_starts_quickly_and_leaves_nothing_behind(engine: docker.DockerClient) -> None:
    """A fresh kernel is ready well before bash_kernel's own 2.7 s start-up; the
    context manager checks that its container, volumes and sockets are gone."""
    with started_kernel(engine) as fresh:
        cell = ok(fresh.execute("echo $HOME $TMPDIR; id -u; pwd"))
        assert cell.stream("stdout") == "/tmp/home /tmp\n61000\n/workspace\n"
    assert fresh.started_in < 10, fresh.started_in
