"""kernelgw as a tool for plain function-calling APIs (OpenAI, Anthropic), no framework.

Tool definitions::

    openai_tool()            # Chat Completions: {"type": "function", "function": {name, description, parameters}}
    openai_responses_tool()  # Responses API:    {"type": "function", name, description, parameters, strict}
    anthropic_tool()         # Messages API:     {name, description, input_schema}

Running the model's tool calls in a session, answering in the same shape::

    with Client() as client, client.session() as session:
        ...
        for call in message.tool_calls:                    # OpenAI Chat Completions
            messages.append(run_tool_call(session, call))  # {"role": "tool", "tool_call_id", "content"}
        ...
        results = [run_tool_call(session, block)           # Anthropic: tool_use blocks
                   for block in response.content if block.type == "tool_use"]
        messages.append({"role": "user", "content": results})   # tool_result blocks

A call may be a dict or an SDK object (anything with ``model_dump()``), in any of
the three shapes:

* OpenAI Chat Completions ``{"id", "type": "function", "function": {"name", "arguments": "<JSON text>"}}``
  -> ``{"role": "tool", "tool_call_id", "content": "<text>"}``;
* OpenAI Responses ``{"type": "function_call", "call_id", "name", "arguments": "<JSON text>"}``
  -> ``{"type": "function_call_output", "call_id", "output": ...}`` (text, or text
  and ``input_image`` items when the code displayed images);
* Anthropic ``{"type": "tool_use", "id", "name", "input": {...}}``
  -> ``{"type": "tool_result", "tool_use_id", "content": [text and image blocks], "is_error"}``.

Chat Completions tool messages carry text only; the observation says how many
images were displayed (take them from `Observation.images` via `observe` if you
want to show them). The text is the shared `observation` format. Arguments that
are not valid JSON or lack ``code`` produce an error result the model can act on,
not an exception; a call for another tool raises `ValueError` (check with
`is_kernelgw_call` when the model has several tools).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from kernelgw.integrations.observation import Observation, observe
from kernelgw.kernels import DEFAULT_KERNEL, profile

if TYPE_CHECKING:
    from kernelgw.client import AsyncSession, Session

__all__ = [
    "TOOL_DESCRIPTION",
    "TOOL_NAME",
    "ToolCall",
    "ToolText",
    "anthropic_tool",
    "arun_tool_call",
    "arun_tool_calls",
    "code_parameters",
    "is_kernelgw_call",
    "openai_responses_tool",
    "openai_tool",
    "parse_tool_call",
    "run_tool_call",
    "run_tool_calls",
    "tool_result",
    "tool_text",
]

TOOL_NAME = "run_python"
TOOL_DESCRIPTION = (
    "Run Python code in a stateful, sandboxed Jupyter kernel without network access. "
    "Variables, imports and files persist between calls, so build on earlier results "
    "instead of recomputing them. Returns what the code printed, the value of the last "
    "expression, errors with the last traceback frames, and displayed images "
    "(matplotlib: call plt.show()). numpy, pandas and matplotlib are installed; "
    "the working directory is /workspace."
)
CODE_DESCRIPTION = "Python source to run, as in a Jupyter cell; the last expression's value is returned."

Shape = Literal["openai", "openai_responses", "anthropic"]


@dataclass(frozen=True)
class ToolText:
    """A code tool's name and descriptions for one kernel (language)."""

    name: str
    description: str
    code_description: str


_TOOL_NAMES = {"deno": "run_typescript", "ir": "run_r"}
_LANGUAGES = {"deno": "TypeScript or JavaScript (Deno)", "ir": "R", "cpp": "C++", "bash": "Bash"}


def tool_text(kernel: str | None = None) -> ToolText:
    """The tool's name and descriptions for sessions of ``kernel`` (None or
    ``python3``: ``run_python`` as always; else ``run_<language>``, e.g. ``run_ruby``,
    with what the model must know: whether state persists, what a cell is)."""
    if kernel is None or kernel == DEFAULT_KERNEL:
        return ToolText(TOOL_NAME, TOOL_DESCRIPTION, CODE_DESCRIPTION)
    p = profile(kernel)
    lang = _LANGUAGES.get(kernel, p.display_name.split(" (")[0])
    if p.keeps_state:
        state = "Variables and definitions persist between calls, so build on earlier results. "
        code = f"{lang} source to run, as in a Jupyter cell."
    else:
        state = (
            "Each call is compiled and run as a complete program with its own main function; nothing but "
            "files persists between calls. "
        )
        code = f"A complete {lang} program (with its main function) to compile and run."
    description = (
        f"Run {lang} code in a sandboxed Jupyter kernel without network access. "
        f"{state}Returns what the code printed, errors with their messages, and displayed images or tables. "
        "Files in the working directory /workspace persist between calls."
    )
    return ToolText(_TOOL_NAMES.get(kernel, f"run_{kernel}"), description, code)


# ------------------------------------------------------------------ definitions


def code_parameters(description: str = CODE_DESCRIPTION) -> dict[str, Any]:
    """The JSON schema of the tool's arguments: ``{"code": "<python>"}``."""
    return {
        "type": "object",
        "properties": {"code": {"type": "string", "description": description}},
        "required": ["code"],
        "additionalProperties": False,
    }


def openai_tool(*, name: str = TOOL_NAME, description: str = TOOL_DESCRIPTION, strict: bool = True) -> dict[str, Any]:
    """The tool for OpenAI Chat Completions (``tools=[openai_tool()]``); also the shape
    most OpenAI-compatible servers (vLLM, Ollama, LiteLLM, ...) accept."""
    function: dict[str, Any] = {"name": name, "description": description, "parameters": code_parameters()}
    if strict:
        function["strict"] = True
    return {"type": "function", "function": function}


def openai_responses_tool(
    *, name: str = TOOL_NAME, description: str = TOOL_DESCRIPTION, strict: bool = True
) -> dict[str, Any]:
    """The tool for the OpenAI Responses API: the flat function shape."""
    return {
        "type": "function",
        "name": name,
        "description": description,
        "parameters": code_parameters(),
        "strict": strict,
    }


def anthropic_tool(*, name: str = TOOL_NAME, description: str = TOOL_DESCRIPTION) -> dict[str, Any]:
    """The tool for the Anthropic Messages API (``tools=[anthropic_tool()]``)."""
    return {"name": name, "description": description, "input_schema": code_parameters()}


# ------------------------------------------------------------------- tool calls


@dataclass(frozen=True)
class ToolCall:
    """A tool call in any supported shape, normalized."""

    id: str
    name: str
    shape: Shape
    arguments: dict[str, Any] | None
    """The decoded arguments; None when they could not be decoded (see ``problem``)."""
    problem: str | None = None
    """Why the arguments are unusable, in words for the model."""

    @property
    def code(self) -> str | None:
        code = (self.arguments or {}).get("code")
        return code if isinstance(code, str) else None


def _as_mapping(call: Any) -> Mapping[str, Any]:
    if isinstance(call, Mapping):
        return call
    dump = getattr(call, "model_dump", None)
    if callable(dump):  # openai / anthropic SDK objects are pydantic models
        data = dump()
        if isinstance(data, Mapping):
            return data
    raise TypeError(f"not a tool call: {type(call).__name__} (expected a dict or an SDK object)")


def _decode_arguments(raw: Any) -> tuple[dict[str, Any] | None, str | None]:
    if isinstance(raw, Mapping):
        return dict(raw), None
    if raw is None or raw == "":
        return {}, None
    if not isinstance(raw, str):
        return None, f"the arguments are a {type(raw).__name__}, not a JSON object"
    try:
        value = json.loads(raw)
    except ValueError as exc:
        return None, f"the arguments are not valid JSON ({exc})"
    if not isinstance(value, dict):
        return None, "the arguments are not a JSON object"
    return value, None


def parse_tool_call(call: Any) -> ToolCall:
    """Normalize an OpenAI (Chat or Responses) or Anthropic tool call."""
    data = _as_mapping(call)
    kind = data.get("type")
    if kind == "tool_use" or ("input" in data and "function" not in data and kind is None):
        arguments, problem = _decode_arguments(data.get("input"))
        return ToolCall(str(data.get("id", "")), str(data.get("name", "")), "anthropic", arguments, problem)
    if kind == "function_call" or ("call_id" in data and "function" not in data):
        arguments, problem = _decode_arguments(data.get("arguments"))
        return ToolCall(str(data.get("call_id", "")), str(data.get("name", "")), "openai_responses", arguments, problem)
    function = data.get("function")
    if isinstance(function, Mapping):
        arguments, problem = _decode_arguments(function.get("arguments"))
        return ToolCall(str(data.get("id", "")), str(function.get("name", "")), "openai", arguments, problem)
    raise ValueError(
        "not a tool call of a known shape (OpenAI 'function' / 'function_call', Anthropic 'tool_use'): "
        f"keys {sorted(data)}"
    )


def is_kernelgw_call(call: Any, name: str = TOOL_NAME) -> bool:
    """True when ``call`` asks for this tool (by name)."""
    try:
        return parse_tool_call(call).name == name
    except (TypeError, ValueError):
        return False


def _problem(call: ToolCall) -> str | None:
    if call.problem is not None:
        return f'error: invalid arguments for {call.name}: {call.problem}. Expected {{"code": "<python source>"}}.'
    if call.code is None:
        return f'error: {call.name} needs a "code" argument: {{"code": "<python source>"}}.'
    return None


def tool_result(
    call: ToolCall,
    observation: Observation | None = None,
    *,
    text: str | None = None,
    is_error: bool | None = None,
    images: bool = True,
) -> dict[str, Any]:
    """The tool result message for ``call``, in its shape, from an observation (or
    from a bare ``text``). ``images=False`` leaves images out of the Anthropic and
    Responses shapes (Chat Completions tool messages never carry them)."""
    if observation is not None:
        text = observation.text if text is None else text
        is_error = observation.is_error if is_error is None else is_error
        pictures = observation.images if images else []
    else:
        pictures = []
    text = text or ""
    if call.shape == "openai":
        return {"role": "tool", "tool_call_id": call.id, "content": text}
    if call.shape == "openai_responses":
        output: Any = text
        if pictures:
            output = [{"type": "input_text", "text": text}] + [
                {"type": "input_image", "image_url": f"data:{p.mime_type};base64,{p.data}"} for p in pictures
            ]
        return {"type": "function_call_output", "call_id": call.id, "output": output}
    content: list[dict[str, Any]] = [{"type": "text", "text": text}]
    content += [
        {"type": "image", "source": {"type": "base64", "media_type": p.mime_type, "data": p.data}} for p in pictures
    ]
    return {"type": "tool_result", "tool_use_id": call.id, "content": content, "is_error": bool(is_error)}


def _checked(call: Any, name: str) -> ToolCall:
    parsed = parse_tool_call(call)
    if parsed.name != name:
        raise ValueError(f"tool call {parsed.id!r} is for {parsed.name!r}, not {name!r}")
    return parsed


def run_tool_call(
    session: Session,
    call: Any,
    *,
    name: str = TOOL_NAME,
    timeout: float | None = None,
    images: bool = True,
    **observe_options: Any,
) -> dict[str, Any]:
    """Run one tool call in ``session`` and return the result message in its shape.

    ``observe_options`` go to `observe` (``max_chars``, ``traceback_frames``, ...)."""
    parsed = _checked(call, name)
    problem = _problem(parsed)
    if problem is not None:
        return tool_result(parsed, text=problem, is_error=True)
    assert parsed.code is not None
    observation = observe(session.run(parsed.code, timeout=timeout), **observe_options)
    return tool_result(parsed, observation, images=images)


async def arun_tool_call(
    session: AsyncSession,
    call: Any,
    *,
    name: str = TOOL_NAME,
    timeout: float | None = None,
    images: bool = True,
    **observe_options: Any,
) -> dict[str, Any]:
    """`run_tool_call` for an `AsyncSession`."""
    parsed = _checked(call, name)
    problem = _problem(parsed)
    if problem is not None:
        return tool_result(parsed, text=problem, is_error=True)
    assert parsed.code is not None
    observation = observe(await session.run(parsed.code, timeout=timeout), **observe_options)
    return tool_result(parsed, observation, images=images)


def run_tool_calls(session: Session, calls: Iterable[Any], **options: Any) -> list[dict[str, Any]]:
    """`run_tool_call` for each call, in order (they share the kernel, so order matters)."""
    return [run_tool_call(session, call, **options) for call in calls]


async def arun_tool_calls(session: AsyncSession, calls: Iterable[Any], **options: Any) -> list[dict[str, Any]]:
    """`arun_tool_call` for each call, in order."""
    return [await arun_tool_call(session, call, **options) for call in calls]
