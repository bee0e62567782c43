"""Tool definitions and tool-call handling for OpenAI / Anthropic shapes (pure), and
the integrations' lazy imports."""

from __future__ import annotations

import importlib
import json
import sys
from typing import Any, ClassVar

import pytest
from click.testing import CliRunner
from pydantic import BaseModel

from kernelgw.cli.main import main
from kernelgw.client.execution import Execution
from kernelgw.integrations.observation import observe
from kernelgw.integrations.tools import (
    TOOL_NAME,
    anthropic_tool,
    code_parameters,
    is_kernelgw_call,
    openai_responses_tool,
    openai_tool,
    parse_tool_call,
    run_tool_call,
    tool_result,
)
from kernelgw.kernels import PROFILES

SCHEMA = {
    "type": "object",
    "properties": {"code": {"type": "string", "description": code_parameters()["properties"]["code"]["description"]}},
    "required": ["code"],
    "additionalProperties": False,
}


# ------------------------------------------------------------------ definitions


def test_openai_chat_completions_tool() -> None:
    tool = openai_tool()
    assert tool == {
        "type": "function",
        "function": {
            "name": "run_python",
            "description": tool["function"]["description"],
            "parameters": SCHEMA,
            "strict": True,
        },
    }
    assert "stateful" in tool["function"]["description"]
    assert "strict" not in openai_tool(strict=False)["function"]
    json.dumps(tool)  # goes on the wire as is


def test_openai_responses_tool_is_flat() -> None:
    tool = openai_responses_tool(name="python", description="Run it.")
    assert tool == {
        "type": "function",
        "name": "python",
        "description": "Run it.",
        "parameters": SCHEMA,
        "strict": True,
    }


def test_anthropic_tool() -> None:
    tool = anthropic_tool()
    assert set(tool) == {"name", "description", "input_schema"}
    assert tool["name"] == TOOL_NAME and tool["input_schema"] == SCHEMA


def test_strict_mode_rules_hold() -> None:
    # OpenAI strict mode: every property required, no additional properties
    schema = openai_tool()["function"]["parameters"]
    assert set(schema["required"]) == set(schema["properties"]) and schema["additionalProperties"] is False


# ------------------------------------------------------------------- tool calls

CHAT_CALL = {"id": "call_1", "type": "function", "function": {"name": "run_python", "arguments": '{"code": "1 + 1"}'}}
RESPONSES_CALL = {
    "type": "function_call",
    "id": "fc_1",
    "call_id": "call_2",
    "name": "run_python",
    "arguments": '{"code": "2 + 2"}',
    "status": "completed",
}
ANTHROPIC_CALL = {"type": "tool_use", "id": "toolu_1", "name": "run_python", "input": {"code": "3 + 3"}}


class Function(BaseModel):  # the shape of the openai SDK's objects
    name: str
    arguments: str


class ChatCompletionMessageToolCall(BaseModel):
    id: str
    type: str
    function: Function


def test_parse_each_shape() -> None:
    chat = parse_tool_call(CHAT_CALL)
    assert (chat.id, chat.name, chat.shape, chat.code) == ("call_1", "run_python", "openai", "1 + 1")
    responses = parse_tool_call(RESPONSES_CALL)
    assert (responses.id, responses.shape, responses.code) == ("call_2", "openai_responses", "2 + 2")
    anthropic = parse_tool_call(ANTHROPIC_CALL)
    assert (anthropic.id, anthropic.shape, anthropic.code) == ("toolu_1", "anthropic", "3 + 3")
    sdk = parse_tool_call(ChatCompletionMessageToolCall.model_validate(CHAT_CALL))
    assert (sdk.id, sdk.shape, sdk.code) == ("call_1", "openai", "1 + 1")


def test_parse_refuses_what_is_not_a_tool_call() -> None:
    with pytest.raises(ValueError, match="not a tool call of a known shape"):
        parse_tool_call({"role": "assistant", "content": "hi"})
    with pytest.raises(TypeError):
        parse_tool_call(42)
    assert not is_kernelgw_call({"role": "assistant"})
    assert is_kernelgw_call(ANTHROPIC_CALL)
    assert not is_kernelgw_call({**ANTHROPIC_CALL, "name": "web_search"})


class NoRun:
    """A session that must not be used."""

    def run(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the code must not run")


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        ('{"code": ', "the arguments are not valid JSON"),
        ("[1, 2]", "the arguments are not a JSON object"),
        ('{"source": "1"}', 'run_python needs a "code" argument'),
        ('{"code": 5}', 'run_python needs a "code" argument'),
    ],
)
def test_bad_arguments_answer_with_an_error_for_the_model(arguments: str, problem: str) -> None:
    call = {**CHAT_CALL, "function": {"name": "run_python", "arguments": arguments}}
    result = run_tool_call(NoRun(), call)  # type: ignore[arg-type]
    assert result["role"] == "tool" and result["tool_call_id"] == "call_1"
    assert result["content"].startswith("error: ") and problem in result["content"]
    anthropic = run_tool_call(NoRun(), {**ANTHROPIC_CALL, "input": {}})  # type: ignore[arg-type]
    assert anthropic["is_error"] is True and 'needs a "code" argument' in anthropic["content"][0]["text"]


def test_a_call_for_another_tool_raises() -> None:
    with pytest.raises(ValueError, match="is for 'web_search', not 'run_python'"):
        run_tool_call(NoRun(), {**RESPONSES_CALL, "name": "web_search"})  # type: ignore[arg-type]


PNG = "iVBORw0KGgo="
PLOT = Execution(
    [
        {"type": "stream", "name": "stdout", "text": "drawn\n"},
        {"type": "display", "data": {"text/plain": "<Figure>", "image/png": PNG}},
        {"type": "done", "status": "ok", "duration_ms": 1.0},
    ]
)
FAILED = Execution(
    [
        {
            "type": "error",
            "ename": "NameError",
            "evalue": "name 'x' is not defined",
            "traceback": [],
            "traceback_text": [],
        },
        {"type": "done", "status": "error", "duration_ms": 1.0},
    ]
)


def test_result_shapes() -> None:
    obs = observe(PLOT)
    text = "stdout:\ndrawn\ndisplayed: 1 image (image/png)"
    assert tool_result(parse_tool_call(CHAT_CALL), obs) == {"role": "tool", "tool_call_id": "call_1", "content": text}
    assert tool_result(parse_tool_call(RESPONSES_CALL), obs) == {
        "type": "function_call_output",
        "call_id": "call_2",
        "output": [
            {"type": "input_text", "text": text},
            {"type": "input_image", "image_url": f"data:image/png;base64,{PNG}"},
        ],
    }
    assert tool_result(parse_tool_call(RESPONSES_CALL), obs, images=False)["output"] == text
    assert tool_result(parse_tool_call(ANTHROPIC_CALL), obs) == {
        "type": "tool_result",
        "tool_use_id": "toolu_1",
        "content": [
            {"type": "text", "text": text},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
        ],
        "is_error": False,
    }
    failed = tool_result(parse_tool_call(ANTHROPIC_CALL), observe(FAILED))
    assert failed["is_error"] is True
    assert failed["content"] == [{"type": "text", "text": "error: NameError: name 'x' is not defined"}]


def test_run_tool_call_runs_the_code_in_the_session() -> None:
    class Recorder:
        codes: ClassVar[list[str]] = []

        def run(self, code: str, *, timeout: float | None = None) -> Execution:
            self.codes.append(code)
            return PLOT

    session = Recorder()
    result = run_tool_call(session, ANTHROPIC_CALL, max_chars=10_000)  # type: ignore[arg-type]
    assert session.codes == ["3 + 3"]
    assert result["tool_use_id"] == "toolu_1" and result["content"][1]["type"] == "image"


# ---------------------------------------------------------------- lazy imports


@pytest.mark.parametrize(
    ("module", "dependency", "extra"),
    [("kernelgw.integrations.langchain", "langchain_core", "langchain"), ("kernelgw.integrations.mcp", "mcp", "mcp")],
)
def test_a_missing_extra_is_named(monkeypatch: pytest.MonkeyPatch, module: str, dependency: str, extra: str) -> None:
    import kernelgw.integrations

    monkeypatch.delitem(sys.modules, module, raising=False)
    monkeypatch.delattr(kernelgw.integrations, module.rsplit(".", 1)[1], raising=False)
    monkeypatch.setitem(sys.modules, dependency, None)  # makes `import dependency` fail
    with pytest.raises(ImportError, match=rf"pip install 'kernelgw\[{extra}\]'"):
        importlib.import_module(module)


def test_kernelgw_imports_no_integration() -> None:
    import kernelgw

    assert "tools" not in dir(kernelgw)
    code = "import kernelgw, kernelgw.client, sys; print(any(m.startswith(('mcp', 'langchain')) for m in sys.modules))"
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_mcp_command_without_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import kernelgw.integrations

    monkeypatch.delitem(sys.modules, "kernelgw.integrations.mcp", raising=False)
    monkeypatch.delattr(kernelgw.integrations, "mcp", raising=False)  # an earlier import's attribute
    # integration tests may have imported mcp's submodules already: hide them all
    for name in [n for n in sys.modules if n == "mcp" or n.startswith("mcp.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "mcp", None)
    result = CliRunner().invoke(main, ["mcp", "--server", "http://127.0.0.1:1"])
    assert result.exit_code == 1
    assert "pip install 'kernelgw[mcp]'" in result.output


def test_mcp_command_checks_the_server_url() -> None:
    pytest.importorskip("mcp")
    result = CliRunner().invoke(main, ["mcp", "--server", "ftp://x"])
    assert result.exit_code == 2 and "--server" in result.output


@pytest.mark.parametrize(
    ("kernel", "name", "described"),
    [
        (None, "run_python", "Python source"),
        ("ruby", "run_ruby", "Ruby source"),
        ("go", "run_go", "complete Go program"),
    ],
)
def test_the_code_tool_is_named_and_described_for_its_kernel(kernel: str | None, name: str, described: str) -> None:
    """One code tool per sandbox language, in MCP, LangChain and the tool texts
    (an MCP server that could not build its tool once failed every MCP client)."""
    import asyncio

    from kernelgw.integrations.langchain import KernelGWTool
    from kernelgw.integrations.mcp import create_server
    from kernelgw.integrations.tools import tool_text

    text = tool_text(kernel)
    assert text.name == name and described in text.code_description
    tools = asyncio.run(create_server("http://127.0.0.1:1", kernel=kernel).list_tools())
    (code_tool,) = [t for t in tools if t.name.startswith("run_")]
    assert code_tool.name == name and code_tool.description == text.description
    assert described in code_tool.input_schema["properties"]["code"]["description"]
    tool = KernelGWTool(kernel=kernel) if kernel else KernelGWTool()
    assert tool.name == name and tool.session_options == ({"kernel": kernel} if kernel else {})
    if kernel is not None and not PROFILES[kernel].keeps_state:
        assert "nothing but files persists" in text.description
