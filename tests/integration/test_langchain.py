"""The LangChain tool in a real agent loop against a real gateway.

The agent is LangChain's tool-calling agent (`langchain.agents.create_agent`, a
LangGraph graph); the chat model is scripted: it replays AIMessages with real
``tool_calls`` and, for its final answers, quotes the last tool observation. So
every value asserted here was computed by the kernel, never by the fake model.
"""

from __future__ import annotations

import base64
import itertools
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

pytest.importorskip("langchain_core", reason="needs the langchain extra: pip install 'kernelgw[langchain]'")

from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.checkpoint.memory import InMemorySaver
from pydantic import Field

from kernelgw.client import Client
from kernelgw.integrations.langchain import KernelGWTool

pytestmark = pytest.mark.integration

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_ids = itertools.count(1)

Step = Callable[[Sequence[BaseMessage]], AIMessage]


def call(code: str) -> Step:
    """A model turn that calls the tool with ``code``."""

    def step(messages: Sequence[BaseMessage]) -> AIMessage:
        return AIMessage(
            content="",
            tool_calls=[
                {"name": "run_python", "args": {"code": code}, "id": f"call_{next(_ids)}", "type": "tool_call"}
            ],
        )

    return step


def answer(messages: Sequence[BaseMessage]) -> AIMessage:
    """A final model turn: quote the last tool observation (the model read it)."""
    last = next(m for m in reversed(messages) if isinstance(m, ToolMessage))
    return AIMessage(content=f"The tool said: {last.content}")


class ScriptedChatModel(BaseChatModel):
    """A chat model that replays a script of turns; records the tools it was bound to."""

    script: list[Step]
    bound_tools: list[dict[str, Any]] = Field(default_factory=list)
    seen: list[list[BaseMessage]] = Field(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedChatModel:  # type: ignore[override]
        self.bound_tools = [convert_to_openai_tool(t) for t in tools]
        return self

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        assert self.script, "the agent asked the model for more turns than scripted"
        self.seen.append(list(messages))
        return ChatResult(generations=[ChatGeneration(message=self.script.pop(0)(messages))])


def tool_messages(result: dict[str, Any]) -> list[ToolMessage]:
    return [m for m in result["messages"] if isinstance(m, ToolMessage)]


def last_turn_tools(result: dict[str, Any]) -> list[ToolMessage]:
    """The ToolMessages after the last human message (one agent invocation)."""
    messages = result["messages"]
    start = max(i for i, m in enumerate(messages) if m.type == "human")
    return [m for m in messages[start:] if isinstance(m, ToolMessage)]


@pytest.fixture
def tool(gateway_url: str) -> Iterator[KernelGWTool]:
    with KernelGWTool(base_url=gateway_url) as tool:
        yield tool


def agent_for(model: ScriptedChatModel, tool: KernelGWTool) -> Any:
    return create_agent(model, [tool], checkpointer=InMemorySaver())


# --------------------------------------------------------------- tutorial tasks

MONTE_CARLO = """\
import random
random.seed(1234)
n = 200_000
inside = sum(1 for _ in range(n) if random.random() ** 2 + random.random() ** 2 <= 1)
print(f"pi ~ {4 * inside / n}")
"""
FACTORIAL = "import math\nmath.factorial(10)"
FIBONACCI = """\
def fib(n):
    a, b = 0, 1
    out = []
    for _ in range(n):
        out.append(a)
        a, b = b, a + b
    return out
fib(15)
"""
SUM_FIRST = "print(sum(range(1, 10001)), sum(range(10000)))"


def test_tutorial_tasks_in_a_react_loop(tool: KernelGWTool) -> None:
    model = ScriptedChatModel(
        script=[call(MONTE_CARLO), answer, call(FACTORIAL), answer, call(FIBONACCI), answer, call(SUM_FIRST), answer]
    )
    agent = agent_for(model, tool)
    config = {"configurable": {"thread_id": "tutorial"}}
    observations = []
    for question in (
        "Estimate pi with a Monte Carlo simulation.",
        "What is 10 factorial?",
        "List the first 15 Fibonacci numbers.",
        "What is the sum of the first 10000 numbers?",
    ):
        result = agent.invoke({"messages": [("user", question)]}, config)
        [observation] = last_turn_tools(result)
        assert observation.status == "success"
        assert result["messages"][-1].content == f"The tool said: {observation.content}"
        observations.append(observation)

    # the model was offered the tool with its JSON schema
    [schema] = model.bound_tools
    assert schema["function"]["name"] == "run_python"
    assert schema["function"]["parameters"]["required"] == ["code"]

    pi = float(re.search(r"pi ~ ([0-9.]+)", observations[0].content).group(1))  # type: ignore[union-attr]
    assert abs(pi - 3.14159) < 0.02
    assert observations[0].content.startswith("stdout:\n")
    assert observations[1].content == "result:\n3628800"
    assert "[0, 1, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 377]" in observations[2].content
    assert "50005000 49995000" in observations[3].content  # 1..10000 and 0..9999
    # one conversation, one kernel: every call ran in the same session, in order
    assert [o.artifact["execution_count"] for o in observations] == [1, 2, 3, 4]
    assert len({o.artifact["session_id"] for o in observations}) == 1
    assert tool.sessions() == {"tutorial": observations[0].artifact["session_id"]}


# ---------------------------------------------------------- three-turn analysis

TURN_1 = """\
import pandas as pd
import numpy as np
rng = np.random.default_rng(7)
sales = pd.DataFrame({
    "region": np.repeat(["north", "south", "east", "west"], 25),
    "units": rng.integers(1, 50, 100),
    "price": rng.choice([9.5, 12.0, 20.0], 100),
})
sales["revenue"] = sales.units * sales.price
print(sales.shape, round(sales.revenue.sum(), 2))
"""
TURN_2 = """\
by_region = sales.groupby("region").revenue.sum().sort_values(ascending=False)
best = by_region.index[0]
by_region.round(2).to_dict()
"""
TURN_3 = """\
import matplotlib.pyplot as plt
ax = by_region.plot.bar(title=f"revenue by region (best: {best})")
ax.figure.savefig("by_region.png")
plt.show()
by_region.to_frame()
"""
# What the same analysis gives locally, to check that the kernel computed it.
EXPECTED = """\
import numpy as np, pandas as pd
rng = np.random.default_rng(7)
sales = pd.DataFrame({"region": np.repeat(["north", "south", "east", "west"], 25),
                      "units": rng.integers(1, 50, 100), "price": rng.choice([9.5, 12.0, 20.0], 100)})
sales["revenue"] = sales.units * sales.price
"""


async def test_three_turn_analysis_keeps_state_async(gateway_url: str) -> None:
    pd = pytest.importorskip("pandas")
    local: dict[str, Any] = {}
    exec(EXPECTED, local)
    expected_total = round(float(local["sales"].revenue.sum()), 2)
    expected_by_region = local["sales"].groupby("region").revenue.sum().round(2).to_dict()
    assert isinstance(local["sales"], pd.DataFrame)

    async with KernelGWTool(base_url=gateway_url) as tool:
        model = ScriptedChatModel(script=[call(TURN_1), answer, call(TURN_2), answer, call(TURN_3), answer])
        agent = agent_for(model, tool)
        config = {"configurable": {"thread_id": "analysis"}}
        turns = []
        for question in ("Make a sales table.", "Revenue per region?", "Plot it."):
            result = await agent.ainvoke({"messages": [("user", question)]}, config)
            [observation] = last_turn_tools(result)
            turns.append(observation)

        assert turns[0].content == f"stdout:\n(100, 4) {expected_total}"
        # turn 2 used `sales` from turn 1
        for region, revenue in expected_by_region.items():
            assert f"'{region}': {revenue}" in turns[1].content
        # turn 3 used `by_region` and `best` from turn 2: an image, an HTML table, a file
        third = turns[2]
        assert third.status == "success"
        assert "displayed: 1 image (image/png), 1 HTML output" in third.content
        assert "files: created by_region.png" in third.content
        artifact = third.artifact
        assert base64.b64decode(artifact["images"][0]["data"]).startswith(PNG_MAGIC)
        assert artifact["images"][0]["mime_type"] == "image/png"
        assert "<table" in artifact["html"][0] and "revenue" in artifact["html"][0]
        assert [(f["path"], f["change"], f["mime_type"]) for f in artifact["files"]] == [
            ("by_region.png", "created", "image/png")
        ]
        # the model was shown the earlier observations in later turns (conversation memory)
        later_prompt = model.seen[-1]
        assert any(isinstance(m, ToolMessage) and m.content == turns[0].content for m in later_prompt)
        session_id = artifact["session_id"]

    # closing the tool deleted the conversation's session
    with Client(gateway_url) as client:
        assert session_id not in [s.id for s in client.list_sessions()]


# ------------------------------------------------------------ errors, isolation


def test_error_observation_has_the_last_frames(tool: KernelGWTool) -> None:
    code = "def outer(x):\n    return inner(x)\ndef inner(x):\n    return 1 / x\nouter(0)"
    model = ScriptedChatModel(script=[call(code), answer])
    result = agent_for(model, tool).invoke(
        {"messages": [("user", "divide")]}, {"configurable": {"thread_id": "errors"}}
    )
    [observation] = tool_messages(result)
    text = observation.content
    assert "error: ZeroDivisionError: division by zero" in text
    assert "\ntraceback:\nCell In[1], line 5" in text
    assert "----> 4     return 1 / x" in text  # the frame where it happened
    assert "\x1b[" not in text  # no ANSI colours for the model
    assert observation.artifact["status"] == "error"


def test_threads_get_separate_sessions_and_sync_async_share_one(tool: KernelGWTool) -> None:
    a = {"configurable": {"thread_id": "a"}}
    b = {"configurable": {"thread_id": "b"}}
    tool.invoke({"code": "secret = 41"}, a)
    missing = tool.invoke({"name": "run_python", "args": {"code": "secret"}, "id": "c1", "type": "tool_call"}, b)
    assert isinstance(missing, ToolMessage)
    assert "error: NameError: name 'secret' is not defined" in missing.content

    import asyncio

    async def later() -> Any:
        return await tool.ainvoke(
            {"name": "run_python", "args": {"code": "secret + 1"}, "id": "c2", "type": "tool_call"}, a
        )

    found = asyncio.run(later())
    assert found.content == "result:\n42"
    sessions = tool.sessions()
    assert set(sessions) == {"a", "b"} and sessions["a"] != sessions["b"]
    assert found.artifact["session_id"] == sessions["a"]

    tool.close(thread_id="a")
    assert set(tool.sessions()) == {"b"}
    with Client(tool.base_url) as client:
        live = [s.id for s in client.list_sessions()]
    assert sessions["a"] not in live and sessions["b"] in live


def test_existing_session_is_used_and_not_deleted(gateway_url: str) -> None:
    with Client(gateway_url) as client, client.session() as session:
        session.run("x = 'from the app'")
        with KernelGWTool(base_url=gateway_url, session_id=session.id, images_in_content=True) as tool:
            assert tool.invoke({"code": "x"}) == "result:\n'from the app'"
            message = tool.invoke(
                {
                    "name": "run_python",
                    "id": "c3",
                    "type": "tool_call",
                    "args": {"code": "import matplotlib.pyplot as plt\nplt.plot([1, 2]); plt.show()"},
                }
            )
            text, image = message.content
            assert text == {"type": "text", "text": "displayed: 1 image (image/png)"}
            assert image["type"] == "image" and image["mime_type"] == "image/png"
            assert base64.b64decode(image["base64"]).startswith(PNG_MAGIC)
        assert session.info().state == "idle"  # still there


async def test_parallel_tool_calls_of_one_conversation_share_one_session(gateway_url: str) -> None:
    def both(messages: Sequence[BaseMessage]) -> AIMessage:
        return AIMessage(
            content="",
            tool_calls=[
                {"name": "run_python", "args": {"code": "import os\nos.getpid()"}, "id": "p1", "type": "tool_call"},
                {"name": "run_python", "args": {"code": "import os\nos.getpid()"}, "id": "p2", "type": "tool_call"},
            ],
        )

    async with KernelGWTool(base_url=gateway_url) as tool:
        model = ScriptedChatModel(script=[both, answer])
        result = await agent_for(model, tool).ainvoke(
            {"messages": [("user", "twice")]}, {"configurable": {"thread_id": "parallel"}}
        )
        first, second = tool_messages(result)
        assert first.artifact["session_id"] == second.artifact["session_id"]
        assert first.content == second.content  # the same kernel process
        assert list(tool.sessions()) == ["parallel"]


def test_a_session_the_gateway_ended_is_replaced(tool: KernelGWTool) -> None:
    config = {"configurable": {"thread_id": "reaped"}}
    tool.invoke({"code": "kept = 1"}, config)
    first = tool.sessions()["reaped"]
    with Client(tool.base_url) as client:  # e.g. the gateway's idle reaper
        client.get_session(first).delete()
    message = tool.invoke({"name": "run_python", "args": {"code": "kept"}, "id": "r1", "type": "tool_call"}, config)
    assert message.content.startswith("note: the previous session had ended")
    assert "error: NameError: name 'kept' is not defined" in message.content
    second = tool.sessions()["reaped"]
    assert second != first and message.artifact["session_id"] == second

    import asyncio

    with Client(tool.base_url) as client:
        client.get_session(second).delete()
    again = asyncio.run(tool.ainvoke({"code": "1 + 1"}, config))
    assert again.startswith("note: the previous session had ended") and again.endswith("result:\n2")
