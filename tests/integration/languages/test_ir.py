"""The R kernel (IRkernel behind the shim) in a container started by the
gateway's own backend, with the gateway's options: the agent demo's four tasks,
state between cells, an error with its message, an interrupt, stdout and stderr,
a plot as PNG and a data.frame as a table, an artifact, and nothing left behind.

The image comes from ``KERNELGW_IMAGE_IR`` (default ``kernelgw/ir:latest``); when
it is missing the tests fail and say how to build it.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import struct
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

IMAGE = os.environ.get("KERNELGW_IMAGE_IR", "kernelgw/ir:latest")
RUNTIME = os.environ.get("KERNELGW_TEST_RUNTIME", "runc")
ARTIFACTS = {"artifacts": "__import__('kernelgw_kernel').artifacts()"}


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
            f"Kernel image {IMAGE} missing; build it with `kernelgw image build --kernel ir` "
            "(or set KERNELGW_IMAGE_IR to a built tag)",
            pytrace=False,
        )
    yield client
    client.close()


@contextmanager
def started_kernel(client: docker.DockerClient) -> Iterator[Kernel]:
    """A kernel started as the gateway starts one (its backend, default options,
    sealed after its first kernel_info reply); afterwards nothing of it is left."""
    settings = Settings(gateway_name=f"lr{os.getpid()}{uuid.uuid4().hex[:4]}", runtime_dir=Path("/tmp/kgwt"))
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
        kernel.execute("n <- 100000\nx <- runif(n); y <- runif(n)\ncat(sprintf('%.4f\\n', 4 * mean(x^2 + y^2 <= 1)))")
    )
    assert 3.0 < float(cell.stream("stdout").strip()) < 3.3, cell.stream("stdout")


def test_factorial_of_10(kernel: Kernel) -> None:
    cell = ok(kernel.execute("cat(factorial(10), '\\n', sep = '')"))
    assert cell.stream("stdout") == "3628800\n"


def test_first_ten_fibonacci_numbers(kernel: Kernel) -> None:
    cell = ok(
        kernel.execute(
            "fib <- numeric(10); fib[2] <- 1\n"
            "for (i in 3:10) fib[i] <- fib[i - 1] + fib[i - 2]\n"
            "cat(fib, sep = ' '); cat('\\n')"
        )
    )
    assert cell.stream("stdout") == "0 1 1 2 3 5 8 13 21 34\n"


def test_sum_of_1_to_10000(kernel: Kernel) -> None:
    cell = ok(kernel.execute("total <- 0\nfor (i in 1:10000) total <- total + i\ncat(total, '\\n', sep = '')"))
    assert cell.stream("stdout") == "50005000\n"


# ------------------------------------------------------------------- R's ways
def test_state_persists_between_cells(kernel: Kernel) -> None:
    ok(kernel.execute("answer <- 41\nsquare <- function(v) v^2"))
    cell = ok(kernel.execute("cat(answer + 1, square(3), '\\n')"))
    assert cell.stream("stdout") == "42 9 \n"


def test_a_value_displays_as_text_html_and_markdown(kernel: Kernel) -> None:
    (shown,) = ok(kernel.execute("1 + 1")).displays
    assert shown["text/plain"] == "[1] 2"
    assert shown["text/html"] == shown["text/markdown"] == "2"


def test_an_error_has_its_message_and_a_traceback(kernel: Kernel) -> None:
    cell = kernel.execute("inner <- function() stop('boom: no such column')\nouter <- function() inner()\nouter()")
    assert cell.reply["status"] == "error", cell.reply
    (error,) = cell.of_type("error")
    assert error["ename"] == cell.reply["ename"] == "ERROR"
    assert "boom: no such column" in error["evalue"]
    trace = "\n".join(error["traceback"])
    assert "outer()" in trace and "inner()" in trace, trace
    # the kernel goes on, and its state too
    assert ok(kernel.execute("cat(answer, '\\n')")).stream("stdout") == "41 \n"


def test_stdout_and_stderr_stream_apart(kernel: Kernel) -> None:
    cell = ok(kernel.execute("cat('out-1\\n')\nmessage('err-1')\nSys.sleep(1.5)\ncat('out-2\\n')\nwarning('careful')"))
    assert cell.stream("stdout") == "out-1\nout-2\n"
    stderr = cell.stream("stderr")
    assert "err-1" in stderr and "careful" in stderr, stderr
    # output of each top-level expression is sent when it ends, not with the cell's end
    assert cell.arrival("stdout", "out-2") - cell.arrival("stdout", "out-1") > 1.0


def test_sigint_interrupts_an_endless_loop_and_the_kernel_goes_on(kernel: Kernel) -> None:
    ok(kernel.execute("kept <- 'yes'"))
    cell = kernel.execute("while (TRUE) {}", interrupt_after=1.0, timeout=30)
    # IRkernel answers an interrupted cell with status "abort"
    assert cell.reply["status"] == "abort", cell.reply
    assert ok(kernel.execute("cat('still', kept, '\\n')")).stream("stdout") == "still yes \n"
    sleeping = kernel.execute("Sys.sleep(100)", interrupt_after=1.0, timeout=30)
    assert sleeping.reply["status"] == "abort", sleeping.reply


def test_a_plot_is_a_png_drawn_without_x(kernel: Kernel) -> None:
    cell = ok(kernel.execute("plot(1:10, main = 'squares')"))
    (plot,) = cell.displays
    png = base64.b64decode(plot["image/png"])
    assert png.startswith(b"\x89PNG")
    width, height = struct.unpack(">II", png[16:24])
    assert (width, height) == (840, 600)  # 7 x 5 inches at 120 dpi (Rprofile.site)


def test_a_data_frame_is_a_table(kernel: Kernel) -> None:
    cell = ok(kernel.execute("data.frame(city = c('Oslo', 'Lima'), temp = c(4.5, 19))"))
    (table,) = cell.displays
    assert "<table" in table["text/html"] and "Oslo" in table["text/html"]
    assert "| city" in table["text/markdown"] and "| Lima" in table["text/markdown"]


def test_a_file_written_to_the_workspace_is_an_artifact(kernel: Kernel) -> None:
    cell = ok(kernel.execute("write.csv(data.frame(a = 1:2), '/workspace/r.csv', row.names = FALSE)"))
    assert {"path": "r.csv", "size": 8, "mime_type": "text/csv", "change": "created"} in cell.artifacts
    assert ok(kernel.execute("cat('unchanged\\n')")).artifacts == []


def test_starts_with_its_directories_under_tmp_and_leaves_nothing_behind(engine: docker.DockerClient) -> None:
    """HOME, R's temporary directory and user library are under /tmp (the root is
    read-only); the context manager checks that container, volumes and sockets are gone."""
    with started_kernel(engine) as fresh:
        cell = ok(fresh.execute("cat(Sys.getenv('HOME'), dirname(tempdir()), .libPaths()[1], getwd(), sep = '\\n')"))
        # (evaluate ends the last line)
        assert cell.stream("stdout") == "/tmp/home\n/tmp\n/tmp/R/library\n/workspace\n"
    assert fresh.started_in < 10, fresh.started_in
