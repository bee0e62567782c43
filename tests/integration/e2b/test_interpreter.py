"""E2B's code-interpreter SDK from PyPI (sync and async), unchanged, against a real
gateway and real kernel containers, configured by environment variables only:
``run_code`` and its callbacks, errors, state, figures and DataFrames, per-cell
environment variables, the SDK's timeout interrupting the cell, the default
context, a language the image lacks, ``is_running``, and a wrong access token
refused."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest
from e2b import SandboxException, TimeoutException
from e2b_code_interpreter import AsyncSandbox, Sandbox

from tests.integration.e2b.conftest import E2BGateway
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def statuses(gw: E2BGateway, sandbox_id: str) -> list[str]:
    """How the sandbox's cells ended, from kernelgw's own history of the session."""
    with httpx.Client(base_url=gw.gateway.url, headers={"Authorization": f"Bearer {gw.key}"}, timeout=30) as http:
        response = http.get(f"/v1/sessions/{sandbox_id}/history")
        response.raise_for_status()
        return [e["status"] for e in response.json()["executions"]]


def test_run_code_returns_the_value_and_keeps_state(sbx: Sandbox) -> None:
    assert sbx.run_code("1+1").text == "2"
    sbx.run_code("x = 40")
    execution = sbx.run_code("x + 2")
    assert (execution.text, execution.error, execution.execution_count) == ("42", None, 3)


def test_home_user_is_the_workspace_as_in_e2b(sbx: Sandbox) -> None:
    """E2B's programs write to /home/user: it is the sandbox's workspace here."""
    wrote = sbx.run_code("open('/home/user/data.csv', 'w').write('a,b\\n1,2\\n')\nimport os\nsorted(os.listdir('.'))")
    assert wrote.error is None and "data.csv" in (wrote.text or ""), wrote
    read = sbx.run_code("import pandas as pd\nint(pd.read_csv('/home/user/data.csv')['b'].sum())")
    assert read.error is None and read.text == "2", read


def test_stdout_and_stderr_reach_the_callbacks(sbx: Sandbox) -> None:
    out: list[str] = []
    err: list[str] = []
    code = "import sys\nprint('to out', flush=True)\nprint('to err', file=sys.stderr, flush=True)"
    execution = sbx.run_code(code, on_stdout=lambda m: out.append(m.line), on_stderr=lambda m: err.append(m.line))
    assert (out, err) == (["to out\n"], ["to err\n"])
    assert (execution.logs.stdout, execution.logs.stderr) == (["to out\n"], ["to err\n"])


def test_an_error_has_its_name_value_and_traceback(sbx: Sandbox) -> None:
    errors: list[Any] = []
    execution = sbx.run_code("def f():\n    raise ValueError('bad value')\nf()", on_error=errors.append)
    assert execution.error is not None
    assert (execution.error.name, execution.error.value) == ("ValueError", "bad value")
    traceback = ANSI.sub("", execution.error.traceback)
    assert "raise ValueError('bad value')" in traceback and "ValueError: bad value" in traceback
    assert errors == [execution.error]
    assert sbx.run_code("'still here'").text == "still here"


def test_a_figure_comes_as_png_and_chart_and_a_dataframe_as_html_text_and_data(sbx: Sandbox) -> None:
    figure = sbx.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [4, 5, 6])\nplt.title('t')\nplt.show()")
    (result,) = figure.results
    assert result.png and not result.is_main_result
    assert result.chart is not None and result.chart.title == "t"
    frame = sbx.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})")
    (table,) = frame.results
    assert table.is_main_result
    assert table.html is not None and "<table" in table.html
    assert table.text is not None and "a  b" in table.text
    assert table.data == {"a": [1, 2], "b": ["x", "y"]}


def test_env_vars_hold_for_their_execution_only(sbx: Sandbox) -> None:
    read = "import os, subprocess\nos.environ.get('E2B_CELL'), subprocess.run(['printenv', 'E2B_CELL'], capture_output=True, text=True).stdout"
    assert sbx.run_code(read, envs={"E2B_CELL": "secret"}).text == "('secret', 'secret\\n')"
    assert sbx.run_code(read).text == "(None, '')"


def test_the_sdk_timeout_interrupts_the_cell_and_the_next_one_runs(sbx: Sandbox, e2b_env: E2BGateway) -> None:
    printed: list[str] = []
    with pytest.raises(TimeoutException, match="Execution timed out"):
        sbx.run_code(
            "import time\nprint('started', flush=True)\ntime.sleep(600)",
            on_stdout=lambda m: printed.append(m.line),
            timeout=3,
        )
    assert printed == ["started\n"]  # streamed before the end
    wait_until(lambda: statuses(e2b_env, sbx.sandbox_id)[-1] == "interrupted", "the abandoned cell's interrupt")
    assert sbx.run_code("'next'").text == "next"


def test_a_language_the_image_lacks_is_a_clear_error(sbx: Sandbox) -> None:
    """Other languages' contexts: test_contexts.py."""
    with pytest.raises(SandboxException, match=r"400 Bad Request.*needs the deno kernel.*no template of this gateway"):
        sbx.run_code("console.log(1)", language="javascript")
    with pytest.raises(SandboxException, match=r"400 Bad Request.*needs the ir kernel"):
        sbx.create_code_context(language="r")
    (context,) = sbx.list_code_contexts()
    assert context.language == "python"
    assert sbx.run_code("1", context=context).text == "1"


def test_the_context_restarts(sbx: Sandbox) -> None:
    sbx.run_code("kept = 1")
    (context,) = sbx.list_code_contexts()
    sbx.restart_code_context(context)
    assert sbx.run_code("'kept' in dir()").text == "False"


def test_a_wrong_access_token_is_refused_as_an_unknown_sandbox(sbx: Sandbox, e2b_env: E2BGateway) -> None:
    headers = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "49999", "X-Access-Token": "not-its-token"}
    with httpx.Client(base_url=e2b_env.url, timeout=30) as http:
        wrong = http.post("/execute", json={"code": "open('ran', 'w')"}, headers=headers)
        unknown = http.post(
            "/execute",
            json={"code": "1"},
            headers={**headers, "E2b-Sandbox-Id": "00000000-0000-0000-0000-000000000000"},
        )
    assert wrong.status_code == unknown.status_code == 502
    assert wrong.json()["message"] == unknown.json()["message"]
    assert "was not found" in wrong.json()["message"]
    assert sbx.run_code("import os; os.path.exists('ran')").text == "False"


def test_is_running_before_and_after_kill(e2b_env: E2BGateway) -> None:
    sandbox = Sandbox.create()
    assert sandbox.is_running()
    sandbox.kill()
    assert not sandbox.is_running()


async def test_the_async_sdk_runs_code_streams_and_reports_errors(e2b_env: E2BGateway) -> None:
    sandbox = await AsyncSandbox.create()
    try:
        lines: list[str] = []

        async def on_stdout(message: Any) -> None:
            lines.append(message.line)

        execution = await sandbox.run_code("print('a', flush=True)\n1+1", on_stdout=on_stdout)
        assert (execution.text, lines) == ("2", ["a\n"])
        failed = await sandbox.run_code("1/0")
        assert failed.error is not None and failed.error.name == "ZeroDivisionError"
        assert await sandbox.is_running()
    finally:
        await sandbox.kill()
    assert not await sandbox.is_running()


def test_a_paused_sandbox_is_running_and_its_context_restarts_with_its_files(sbx: Sandbox) -> None:
    sbx.run_code("x = 1\nopen('kept.txt', 'w').write('k')")
    sbx.pause()
    assert sbx.is_running()  # envd's health answers while the sandbox exists (paused: its state is on disk)
    (context,) = sbx.list_code_contexts()
    # a fresh kernel with the pause's files (under runc and gVisor alike: they come from its snapshot)
    sbx.restart_code_context(context)
    assert sbx.run_code("import os\n'x' in dir(), os.path.exists('kept.txt')").text == "(False, True)"
