"""The pure parts of benchmarks/bench_languages.py's out-of-memory rows: how a bomb's
cell ended, the two rows a kernel's bombs make (a kernel that did not recover is a
row that says so), and report.py rendering them. No Docker, no gateway."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import report
from bench_languages import bomb_outcome, oom_rows

OOM = "out-of-memory: the kernel used more memory than the session's limit and was killed"


def bomb(
    ms: float, recover: float | None, outcome: str = "dead (out-of-memory), state lost, restarted"
) -> dict[str, Any]:
    out: dict[str, Any] = {"bomb_ms": ms, "killed_ms": ms / 2, "outcome": outcome, "reason": OOM}
    if recover is None:
        out["not_recovered"] = "the next cell ended dead (the kernel is not running), printed ''"
    else:
        out["recover_ms"] = recover
    return out


def test_bomb_outcome_names_status_cause_state_and_restart() -> None:
    restarted = {"status": "dead", "state_lost": True, "reason": OOM + "; the kernel was restarted"}
    assert bomb_outcome(restarted) == "dead (out-of-memory), state lost, restarted"
    stuck = {"status": "dead", "state_lost": True, "reason": OOM + "; restart the session to continue"}
    assert bomb_outcome(stuck) == "dead (out-of-memory), state lost, not restarted"
    caught = {"status": "error", "state_lost": False, "reason": None}
    assert bomb_outcome(caught) == "error, state kept"
    assert bomb_outcome(caught, keeps_state=False) == "error, no state"


def test_oom_rows_time_every_round_that_recovered() -> None:
    bomb_row, after_row = oom_rows([bomb(1000, 10), bomb(2000, 30)], [], kernel="python3", image_mb=1)
    assert (bomb_row["name"], bomb_row["n"], bomb_row["p50_ms"]) == ("python3: memory bomb", 2, 1500)
    assert (after_row["name"], after_row["n"], after_row["p50_ms"]) == ("python3: after the bomb", 2, 20)
    assert bomb_row["killed_p50_ms"] == 750 and bomb_row["kernel"] == "python3" and bomb_row["image_mb"] == 1


def test_a_kernel_that_does_not_recover_is_a_row_that_says_so() -> None:
    _, never = oom_rows([bomb(1000, None)], ["HTTPStatusError: 500"], kernel="ir")
    assert never["n"] == 0 and never["error"].startswith("did not recover by itself in 2 of 2 rounds")
    _, some = oom_rows([bomb(1000, 10), bomb(1000, None)], [], kernel="deno")
    assert some["name"] == "deno: after the bomb (1 of 2 rounds did not recover)" and some["n"] == 1
    bomb_row, _ = oom_rows([], ["ReadTimeout: timed out"], kernel="ruby")
    assert bomb_row["n"] == 0 and "ReadTimeout" in bomb_row["error"]


def test_report_renders_the_oom_rows_and_names_a_kernel_that_did_not_recover(tmp_path: Path) -> None:
    rows = oom_rows([bomb(1000, 10)], [], kernel="python3")
    rows += oom_rows([bomb(3000, None)], [], kernel="ir")
    rows += oom_rows([bomb(500, 20, "error, state kept")], [], kernel="java")
    text = "\n".join(report.languages_oom({"rows": rows, "bomb_memory_mb": 384}))
    assert "`memory_mb` 384" in text
    assert "| python3: memory bomb" in text and "3.00x" in text  # ir's bomb against Python's
    assert "| ir: after the bomb" in text and "not measured: did not recover by itself" in text
    assert "**`ir` did not recover by itself**" in text
    assert "`java` (error, state kept)" in text
