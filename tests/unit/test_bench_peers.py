"""The pure parts of benchmarks/bench_peers.py: the trace's checks, the parse of each
peer's output into one shape, and the limits table. No Docker, no peers' packages."""

from __future__ import annotations

import base64
import contextlib
import io
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from peers.adapters import LLMSB_BANNER, strip_banner
from peers.base import (
    PNG_SIGNATURE,
    Output,
    error_name_from_text,
    one_plus_one_ok,
    output_from_v1_events,
)
from peers.jupyter_ws import CellCollector, execute_request
from peers.limits import limits_row
from peers.trace import BIG, GROUP_MAX, TURNS

PNG = PNG_SIGNATURE + b"\x00\x00\x00\rIHDR rest of a png"


def turn(title: str) -> Any:
    return next(t for t in TURNS if t.title == title)


# ------------------------------------------------------------------ the trace


def run_locally(code: str, ns: dict[str, Any]) -> Output:
    """A turn in this interpreter, as a REPL would run it: stdout captured, the last
    expression's repr as the result, an exception's name as the error."""
    import ast

    out = Output()
    buf = io.StringIO()
    tree = ast.parse(code)
    last = tree.body[-1] if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    body = ast.Module(body=tree.body[:-1] if last else tree.body, type_ignores=[])
    try:
        with contextlib.redirect_stdout(buf):
            exec(compile(body, "<turn>", "exec"), ns)
            if last is not None:
                value = eval(compile(ast.Expression(last.value), "<turn>", "eval"), ns)
                if value is not None:
                    out.result = repr(value)
    except Exception as exc:
        out.error = type(exc).__name__
        out.error_text = f"{type(exc).__name__}: {exc}"
    out.stdout = buf.getvalue()
    return out


def test_the_trace_passes_on_a_python_that_keeps_state() -> None:
    """The expected values are right: every turn but the chart (the host has no inline
    backend to emit a PNG) passes when run in one namespace here."""
    pytest.importorskip("pandas")  # in the lock (test extra); a bare install may lack it
    ns: dict[str, Any] = {}
    for t in TURNS:
        if t.title.startswith("matplotlib"):
            continue
        out = run_locally(t.code, ns)
        assert t.check(out) is None, (t.title, t.check(out), out.stdout[:200], out.error_text)


def test_a_stateless_runner_fails_the_turns_that_need_earlier_ones_with_the_reason() -> None:
    pytest.importorskip("pandas")
    failed = {}
    for t in TURNS:
        if t.title.startswith("matplotlib"):
            continue
        why = t.check(run_locally(t.code, {}))  # a fresh namespace every turn
        if why is not None:
            failed[t.title] = why
    assert set(failed) == {
        "describe",
        "groupby sum",
        "derived column",
        "alive after the error",
        "a variable from turn 1",
        "last expression's value",
    }
    assert all(why.startswith("raised NameError: name ") for why in failed.values()), failed


def test_the_chart_turn_wants_a_png_by_its_signature() -> None:
    check = turn("matplotlib chart (PNG)").check
    assert check(Output(images=[PNG])) is None
    assert check(Output()) == "no image came back"
    assert "not a PNG" in (check(Output(images=[b"GIF89a...."])) or "")
    assert "raised" in (check(Output(images=[PNG], error="ValueError", error_text="ValueError: x")) or "")


def test_the_big_print_is_counted() -> None:
    check = turn("1 MB print").check
    assert check(Output(stdout="x" * BIG + "\n")) is None
    assert "999,999" in (check(Output(stdout="x" * (BIG - 1))) or "")
    assert check(Output(stdout="x" * BIG + "[truncated]")) is not None


def test_the_error_turn_wants_the_name_reported() -> None:
    check = turn("an error (KeyError)").check
    assert check(Output(error="KeyError", error_text="KeyError: 'missing'")) is None
    assert check(Output()) == "no error came back"
    assert "'TypeError'" in (check(Output(error="TypeError")) or "")
    assert "free text" in (check(Output(error_text="... KeyError ...")) or "")


def test_the_last_value_turn_needs_a_displayhook() -> None:
    check = turn("last expression's value").check
    assert check(Output(result=GROUP_MAX)) is None
    assert "no displayhook" in (check(Output(stdout="")) or "")
    assert "expected" in (check(Output(result="{}")) or "")


def test_one_plus_one_is_a_result_or_a_print() -> None:
    assert one_plus_one_ok(Output(result="2"))
    assert one_plus_one_ok(Output(stdout="2\n"))
    assert not one_plus_one_ok(Output(stdout="3"))
    assert not one_plus_one_ok(Output(result="2", error="KernelDied"))


# --------------------------------------------------------- parsing the peers' outputs


@pytest.mark.parametrize(
    ("text", "name"),
    [
        # IPython, with its colours
        (
            "\x1b[31m----------\x1b[39m\n\x1b[31mKeyError\x1b[39m      Traceback (most recent call last)\n"
            "\x1b[31mKeyError\x1b[39m: 'missing'",
            "KeyError",
        ),
        # a script's stderr (llm-sandbox stateless)
        (
            "Traceback (most recent call last):\n  File \"x.py\", line 1\nNameError: name 'df' is not defined",
            "NameError",
        ),
        # AutoGen: "ERROR: " twice, then the traceback list's repr on one line
        ("\nERROR: ERROR: KeyError: 'missing'\n['\\x1b[31mKeyError\\x1b[39m  Traceback']", "KeyError"),
        ("pandas.errors.ParserError: bad line", "ParserError"),
        ("all good\n", None),
    ],
)
def test_error_names_are_found_in_tracebacks(text: str, name: str | None) -> None:
    assert error_name_from_text(text) == name


def test_v1_events_become_one_output() -> None:
    png = base64.b64encode(PNG).decode()
    events = [
        {"type": "queued", "code": "..."},
        {"type": "stream", "name": "stdout", "text": "a"},
        {"type": "stream", "name": "stderr", "text": "warning"},
        {"type": "stream", "name": "stdout", "text": "b\n"},
        {"type": "display", "data": {"image/png": png, "text/plain": "<Figure>"}},
        {"type": "result", "data": {"text/plain": "2"}},
        {"type": "done", "status": "ok"},
    ]
    out = output_from_v1_events(events)
    assert (out.stdout, out.result, out.images, out.error) == ("ab\n", "2", [PNG], None)
    err = output_from_v1_events(
        [
            {"type": "error", "ename": "KeyError", "evalue": "'x'", "traceback": ["\x1b[31mKeyError"], "traceback_text": ["KeyError: 'x'"]},
            {"type": "done", "status": "error"},
        ]
    )  # fmt: skip
    assert (err.error, err.error_text) == ("KeyError", "KeyError: 'x'")
    lost = output_from_v1_events([{"type": "done", "status": "timeout", "reason": "too slow"}])
    assert (lost.error, lost.error_text) == ("done:timeout", "too slow")


def test_a_channels_cell_is_done_after_its_reply_and_its_idle() -> None:
    msg_id, request = execute_request("1+1", "s1")
    assert request["header"]["msg_id"] == msg_id and request["content"]["code"] == "1+1"
    cell = CellCollector(msg_id)
    mine, other = {"msg_id": msg_id}, {"msg_id": "someone else's"}
    cell.feed({"msg_type": "stream", "parent_header": other, "content": {"name": "stdout", "text": "not mine"}})
    cell.feed({"msg_type": "stream", "parent_header": mine, "content": {"name": "stdout", "text": "hi\n"}})
    cell.feed({"msg_type": "execute_result", "parent_header": mine, "content": {"data": {"text/plain": "2"}}})
    cell.feed({"msg_type": "status", "parent_header": mine, "content": {"execution_state": "idle"}})
    assert not cell.done  # the reply has not come yet
    cell.feed({"header": {"msg_type": "execute_reply"}, "parent_header": mine, "content": {"status": "ok"}})
    assert cell.done
    assert (cell.out.stdout, cell.out.result) == ("hi\n", "2")


def test_llm_sandbox_banner_is_taken_out_and_nothing_else() -> None:
    assert strip_banner(f"{LLMSB_BANNER}\n2\n") == "2\n"
    assert strip_banner(f"2\n{LLMSB_BANNER}") == "2\n"
    assert strip_banner(f"say {LLMSB_BANNER}\n") == f"say {LLMSB_BANNER}\n"


# ----------------------------------------------------------------------- limits


def test_limits_of_a_locked_down_container() -> None:
    """kernelgw's shape: started as root with the few capabilities setpriv needs, the
    kernel itself (seen by docker top) as an unprivileged uid."""
    attrs = {
        "Config": {"User": "0:0"},
        "HostConfig": {
            "NetworkMode": "none",
            "Memory": 2 * 2**30,
            "MemorySwap": 2 * 2**30,
            "NanoCpus": 1_000_000_000,
            "PidsLimit": 256,
            "ReadonlyRootfs": True,
            "CapDrop": ["ALL"],
            "CapAdd": ["SETUID", "SETGID"],
            "SecurityOpt": ["no-new-privileges:true"],
            "Runtime": "runsc",
        },
    }
    processes = [("0", "docker-init"), ("61000", "python")]
    assert limits_row(attrs, image_user="61000:61000", processes=processes) == {
        "network": "none",
        "memory": "2,048 MiB (no swap)",
        "cpus": "1",
        "pids": "256",
        "read-only root": "yes",
        "code runs as": "uid 61000",
        "capabilities": "ALL dropped, SETUID, SETGID added",
        "no-new-privs": "yes",
        "runtime": "runsc",
    }


def test_limits_of_a_container_run_with_docker_defaults() -> None:
    attrs = {"Config": {"User": ""}, "HostConfig": {"NetworkMode": "default", "PidsLimit": 0, "MemorySwap": 0}}
    row = limits_row(attrs)
    assert row["network"] == "bridge (default)"
    assert (row["memory"], row["cpus"], row["pids"]) == ("unlimited", "unlimited", "unlimited")
    assert (row["read-only root"], row["code runs as"], row["no-new-privs"]) == ("no", "root", "no")
    assert row["capabilities"] == "Docker's default set"
    # the image's USER applies when the container sets none; a held-open container
    # (sleep under tini) runs its code by docker exec as that user
    assert limits_row(attrs, "61000:61000", [("0", "tini"), ("0", "sleep")])["code runs as"] == "uid 61000"
    assert limits_row(attrs, "", [("0", "sleep")])["code runs as"] == "root"
    cpu_quota = limits_row(
        {
            "HostConfig": {
                "CpuQuota": 50_000,
                "CpuPeriod": 100_000,
                "Memory": 2**29,
                "MemorySwap": -1,
                "CapDrop": ["NET_RAW"],
            }
        }
    )
    assert (cpu_quota["cpus"], cpu_quota["memory"]) == ("0.5", "512 MiB + unlimited swap")
    assert cpu_quota["capabilities"] == "Docker's default set minus NET_RAW"


# ----------------------------------------------------------------------- report


def test_the_report_renders_a_peers_run_with_failures_and_a_peer_that_did_not_open(tmp_path: Path) -> None:
    import report

    ok = {"turn": 1, "title": "build a DataFrame", "ms": 12.0, "ok": True, "reason": None}
    bad = {"turn": 1, "title": "build a DataFrame", "ms": 900.0, "ok": False, "reason": "raised NameError: x"}
    row = {"n": 2, "p50_ms": 10.0, "p95_ms": 12.0, "p99_ms": 13.0}
    peers = {
        "date": "2026-11-26T22:48:00+00:00",
        "machine": {"image": "kernelgw/python:latest", "kernelgw_commit": "abc"},
        "peer_image": "kernelgw-peer/kernel-gateway:3.0.1-x",
        "kernel_gateway_version": "3.0.1",
        "args": {"n_start": 2, "n_warm": 2},
        "peers": {n: {"version": "1"} for n in ("kernelgw", "llm-sandbox", "AutoGen DockerJupyterCodeExecutor")},
        "first": [
            {"name": "kernelgw", **row},
            {"name": "llm-sandbox", **row},
            {"name": "AutoGen DockerJupyterCodeExecutor", "n": 0, "error": "boom", "start_retries": 3},
        ],
        "warm": [{"name": "kernelgw", **row}, {"name": "llm-sandbox", **row}],
        "trace": {"kernelgw": [ok], "llm-sandbox": [bad]},
        "trace_turns": [{"turn": 1, "title": "build a DataFrame"}],
        "open_failures": {"AutoGen DockerJupyterCodeExecutor": "ConnectionError: reset"},
        "limits": {"kernelgw": [{"network": "none", "memory": "2,048 MiB (no swap)"}]},
    }
    text = "\n".join(report.peers_section(tmp_path, tmp_path / "benchmarks.md", peers))
    assert "| 1. build a DataFrame | ✓ 12 | ✗ 900 | not run |" in text
    assert "- llm-sandbox, turn 1 (build a DataFrame): raised NameError: x" in text
    assert "AutoGen DockerJupyterCodeExecutor: could not open a session" in text
    assert "not measured: boom" in text
    assert "(3 in this run's starts)" in text
    assert report.peers_section(tmp_path, tmp_path / "b.md", None) == []
