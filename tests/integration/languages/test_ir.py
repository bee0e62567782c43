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
import queue
import struct
import time
from collections.abc import Iterator

import docker
import pytest

from tests.integration.languages import Kernel, image_for, ok, require_image, start_kernel

pytestmark = pytest.mark.integration

IMAGE = image_for("ir")


@pytest.fixture(scope="module")
def kernel() -> Iterator[Kernel]:
    require_image(IMAGE, "ir")
    with start_kernel(IMAGE) as started:
        yield started.kernel


# ------------------------------------------------------------- the demo tasks
def test_pi_by_monte_carlo(kernel: Kernel) -> None:
    cell = ok(
        kernel.execute("n <- 100000\nx <- runif(n); y <- runif(n)\ncat(sprintf('%.4f\\n', 4 * mean(x^2 + y^2 <= 1)))")
    )
    assert 3.0 < float(cell.stdout.strip()) < 3.3, cell.stdout


def test_factorial_of_10(kernel: Kernel) -> None:
    cell = ok(kernel.execute("cat(factorial(10), '\\n', sep = '')"))
    assert cell.stdout == "3628800\n"


def test_first_ten_fibonacci_numbers(kernel: Kernel) -> None:
    cell = ok(
        kernel.execute(
            "fib <- numeric(10); fib[2] <- 1\n"
            "for (i in 3:10) fib[i] <- fib[i - 1] + fib[i - 2]\n"
            "cat(fib, sep = ' '); cat('\\n')"
        )
    )
    assert cell.stdout == "0 1 1 2 3 5 8 13 21 34\n"


def test_sum_of_1_to_10000(kernel: Kernel) -> None:
    cell = ok(kernel.execute("total <- 0\nfor (i in 1:10000) total <- total + i\ncat(total, '\\n', sep = '')"))
    assert cell.stdout == "50005000\n"


# ------------------------------------------------------------------- R's ways
def test_state_persists_between_cells(kernel: Kernel) -> None:
    ok(kernel.execute("answer <- 41\nsquare <- function(v) v^2"))
    cell = ok(kernel.execute("cat(answer + 1, square(3), '\\n')"))
    assert cell.stdout == "42 9 \n"


def test_a_value_displays_as_text_html_and_markdown(kernel: Kernel) -> None:
    (shown,) = ok(kernel.execute("1 + 1")).data
    assert shown["text/plain"] == "[1] 2"
    assert shown["text/html"] == shown["text/markdown"] == "2"
    assert set(shown) == {"text/plain", "text/html", "text/markdown"}


def test_an_error_has_its_message_and_a_traceback(kernel: Kernel) -> None:
    cell = kernel.execute("inner <- function() stop('boom: no such column')\nouter <- function() inner()\nouter()")
    assert cell.reply["status"] == "error", cell.reply
    (error,) = cell.of_type("error")
    assert error["ename"] == cell.reply["ename"] == "ERROR"
    assert "boom: no such column" in error["evalue"]
    trace = "\n".join(error["traceback"])
    assert "outer()" in trace and "inner()" in trace, trace
    # the kernel goes on, and its state too
    assert ok(kernel.execute("cat(answer, '\\n')")).stdout == "41 \n"


def test_a_request_queued_behind_a_failed_cell_still_runs(kernel: Kernel) -> None:
    """IRkernel answered requests queued behind a failed cell with "aborted" and
    no status (kernel.R turns that off): the gateway's end probe, sent right
    after a failed cell's reply, never got its idle."""
    failing = kernel.client.execute("Sys.sleep(0.5); stop('queued behind')", stop_on_error=False)
    probe = kernel.client.execute("", silent=True, store_history=False, stop_on_error=False)
    assert kernel.wait(failing, 30).status == "error"
    assert kernel.wait(probe, 10).status == "ok"


def test_stdout_and_stderr_stream_apart(kernel: Kernel) -> None:
    came = kernel.arrivals("cat('out-1\\n')\nmessage('err-1')\nSys.sleep(1.5)\ncat('out-2\\n')\nwarning('careful')")
    assert "".join(text for _, name, text in came if name == "stdout") == "out-1\nout-2\n"
    stderr = "".join(text for _, name, text in came if name == "stderr")
    assert "err-1" in stderr and "careful" in stderr, stderr
    # each top-level expression's output is sent when it ends, not with the cell's end
    first = {text: t for t, _, text in came}
    assert first["out-2\n"] - first["out-1\n"] > 1.0, came


def test_sigint_interrupts_an_endless_loop_and_the_kernel_goes_on(kernel: Kernel) -> None:
    ok(kernel.execute("kept <- 'yes'"))
    cell, took = kernel.interrupt_when_started("cat('looping\\n')\nwhile (TRUE) {}", "looping")
    # as IPython's (kernel.R; IRkernel itself replied "abort" and showed nothing)
    assert cell.reply["status"] == "error" and cell.reply["ename"] == "KeyboardInterrupt", cell.reply
    assert [e["ename"] for e in cell.errors] == ["KeyboardInterrupt"]
    print(f"interrupted {took:.2f} s after the signal")
    assert ok(kernel.execute("cat('still', kept, '\\n')")).stdout == "still yes \n"
    sleeping, _ = kernel.interrupt_when_started("cat('sleeping\\n')\nSys.sleep(100)\ncat('not reached')", "sleeping")
    assert sleeping.reply["ename"] == "KeyboardInterrupt", sleeping.reply
    assert "not reached" not in sleeping.stdout


def test_sigint_between_cells_changes_nothing(kernel: Kernel) -> None:
    ok(kernel.execute("between <- 1"))
    kernel.signal_between_cells()
    assert ok(kernel.execute("cat(between + 1, '\\n')")).stdout == "2 \n"
    assert kernel.state() == "running"


def test_a_plot_is_a_png_drawn_without_x(kernel: Kernel) -> None:
    cell = ok(kernel.execute("plot(1:10, main = 'squares')"))
    (plot,) = cell.data
    png = base64.b64decode(plot["image/png"])
    assert png.startswith(b"\x89PNG")
    width, height = struct.unpack(">II", png[16:24])
    assert (width, height) == (840, 600)  # 7 x 5 inches at 120 dpi (Rprofile.site)


def test_a_data_frame_is_a_table(kernel: Kernel) -> None:
    cell = ok(kernel.execute("data.frame(city = c('Oslo', 'Lima'), temp = c(4.5, 19))"))
    (table,) = cell.data
    assert "<table" in table["text/html"] and "Oslo" in table["text/html"]
    assert "| city" in table["text/markdown"] and "| Lima" in table["text/markdown"]
    assert "text/latex" not in table  # left out by the image's Rprofile.site


def test_a_file_written_to_the_workspace_is_an_artifact(kernel: Kernel) -> None:
    cell = ok(kernel.execute("write.csv(data.frame(a = 1:2), '/workspace/r.csv', row.names = FALSE)"))
    assert {"path": "r.csv", "size": 8, "mime_type": "text/csv", "change": "created"} in cell.artifacts
    assert ok(kernel.execute("cat('unchanged\\n')")).artifacts == []


def test_the_kernel_logged_no_traceback(kernel: Kernel) -> None:
    client = docker.from_env()
    try:
        logs = client.containers.get(kernel.handle.container_id).logs().decode(errors="replace")
    finally:
        client.close()
    assert "Traceback" not in logs, logs


def test_quit_ends_r_with_its_status_after_what_the_cell_printed() -> None:
    """IRkernel answered ``quit(status = 3)`` as an ok cell and R went on (it asks
    the frontend to shut the kernel down, which no gateway does): R now ends as
    it does outside a kernel, and the gateway ends the cell dead with code 3."""
    with start_kernel(IMAGE) as fresh:
        k = fresh.kernel
        msg_id = k.client.execute('cat("bye\\n")\nquit(save = "no", status = 3)\ncat("not reached\\n")')
        deadline = time.monotonic() + 30
        printed = ""
        while (state := asyncio.run(k.backend.state(k.handle))).alive or k.client.iopub_channel.msg_ready():
            assert time.monotonic() < deadline, f"R still runs after quit(status = 3): {printed!r}"
            try:
                msg = k.client.get_iopub_msg(timeout=0.1)
            except queue.Empty:
                continue
            if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "stream":
                printed += msg["content"]["text"]
        assert state.exit_code == 3, state
        assert printed == "bye\n"


def test_starts_with_its_directories_under_tmp_and_leaves_nothing_behind() -> None:
    """HOME, R's temporary directory and user library are under /tmp (the root is
    read-only); start_kernel checks that container, volumes and sockets are gone."""
    with start_kernel(IMAGE) as fresh:
        cell = ok(
            fresh.kernel.execute("cat(Sys.getenv('HOME'), dirname(tempdir()), .libPaths()[1], getwd(), sep = '\\n')")
        )
        # (evaluate ends the last line)
        assert cell.stdout == "/tmp/home\n/tmp\n/tmp/R/library\n/workspace\n"
    print(f"ready {fresh.ready_s:.2f} s after the container's start")
    # cold start printed, not asserted: benchmarks/bench_languages.py measures it (create (cold))


def test_system_output_is_the_cells_in_order(kernel: Kernel) -> None:
    """system()'s child writes to R's own fd 1 and 2: the cell's stream output,
    before its end, in order with what R prints (the shim relays the kernel's
    fd 1 and 2: kernelgw_kernel.fdrelay)."""
    r = kernel.execute("system('echo sys-1; echo sys-err >&2')\ncat('cat-2\\n')")
    assert r.status == "ok" and r.stdout == "sys-1\ncat-2\n", r.messages
    assert r.stderr == "sys-err\n", r.messages
