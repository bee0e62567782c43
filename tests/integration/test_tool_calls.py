"""Recorded tool calls of OpenAI (Chat Completions, Responses) and Anthropic models,
run against a real gateway with `kernelgw.integrations.tools`.

The payloads in tests/fixtures/tool_calls/ are model answers as the APIs return
them. Each test replays a conversation: it runs every tool call of every turn in
one session (later turns use variables of earlier ones), appends the results in
the API's shape, and checks what the model would read next.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kernelgw.client import AsyncClient, Client, Session
from kernelgw.integrations.tools import arun_tool_call, run_tool_call, run_tool_calls

pytestmark = pytest.mark.integration

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "tool_calls"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def recorded(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / name).read_text())  # type: ignore[no-any-return]


@pytest.fixture
def session(gateway_url: str) -> Iterator[Session]:
    with Client(gateway_url) as client, client.session() as session:
        yield session


def test_openai_chat_completions(session: Session) -> None:
    conversation = recorded("openai_chat_completions.json")
    messages = list(conversation["request"]["messages"])
    turns = []
    for response in conversation["responses"]:
        message = response["choices"][0]["message"]
        assert response["choices"][0]["finish_reason"] == "tool_calls"
        messages.append(message)
        answers = run_tool_calls(session, message["tool_calls"])
        messages.extend(answers)
        turns.append(answers)

    [factorial, total], [digits] = turns
    assert factorial == {"role": "tool", "tool_call_id": "call_8fQ2mWbN0xKq3YtJ1hLr5Vd9", "content": "result:\n3628800"}
    assert total == {"role": "tool", "tool_call_id": "call_Zp4sT7uE2cRn6GvA9kWm1QyH", "content": "stdout:\n50005000"}
    # the second turn used `total` from the first; its plot is described (Chat tool messages carry text only)
    assert digits == {
        "role": "tool",
        "tool_call_id": "call_Ka1Hd5Xo9pLz2RfU7cNw3TbE",
        "content": "result:\n8\ndisplayed: 1 image (image/png)",
    }
    # the next request answers every tool call of each assistant message, in order
    for i, m in enumerate(messages):
        if m["role"] == "assistant":
            ids = [c["id"] for c in m["tool_calls"]]
            assert [a["tool_call_id"] for a in messages[i + 1 : i + 1 + len(ids)]] == ids
    json.dumps(messages)


def test_openai_responses(session: Session) -> None:
    conversation = recorded("openai_responses.json")
    items = list(conversation["request"]["input"])
    outputs = []
    for response in conversation["responses"]:
        items.extend(response["output"])  # reasoning and function_call items go back as input
        calls = [item for item in response["output"] if item["type"] == "function_call"]
        answers = run_tool_calls(session, calls)
        items.extend(answers)
        outputs.extend(answers)

    first, second = outputs
    assert first == {
        "type": "function_call_output",
        "call_id": "call_Qm3nV8rT1yXe5KdP0wLs7JcA",
        "output": "stdout:\n[0, 1, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 377]",
    }
    assert second["call_id"] == "call_Rw2kD9sB4fGh6LmN8pQt1XvZ"
    text, image = second["output"]
    assert text == {"type": "input_text", "text": "result:\n1.618026\ndisplayed: 1 image (image/png)"}
    assert image["type"] == "input_image"
    prefix = "data:image/png;base64,"
    assert image["image_url"].startswith(prefix)
    assert base64.b64decode(image["image_url"][len(prefix) :]).startswith(PNG_MAGIC)
    json.dumps(items)


async def test_anthropic_messages_async(gateway_url: str) -> None:
    pd = pytest.importorskip("pandas")
    np = pytest.importorskip("numpy")
    conversation = recorded("anthropic_messages.json")

    # the same simulation locally: the kernel's numbers must match
    rng = np.random.default_rng(42)
    orders = pd.DataFrame(
        {
            "region": rng.choice(["north", "south", "east", "west"], 1000),
            "units": rng.integers(1, 20, 1000),
            "price": rng.choice([4.5, 9.99, 15.0], 1000),
        }
    )
    orders["revenue"] = orders.units * orders.price
    expected = orders.groupby("region").revenue.sum().round(2).to_dict()

    messages = list(conversation["request"]["messages"])
    results = []
    async with AsyncClient(gateway_url) as client, client.session() as session:
        for response in conversation["responses"]:
            assert response["stop_reason"] == "tool_use"
            messages.append({"role": "assistant", "content": response["content"]})
            blocks = [await arun_tool_call(session, b) for b in response["content"] if b["type"] == "tool_use"]
            messages.append({"role": "user", "content": blocks})
            results.extend(blocks)

    simulated, typo, chart = results
    assert simulated["tool_use_id"] == "toolu_01Hq4mT9wZr2Lx6Nc8Vb3KpD" and simulated["is_error"] is False
    [text] = simulated["content"]
    assert text["text"].startswith("stdout:\n(1000, 4)\nresult:\n")
    assert "region" in text["text"] and "displayed: 1 HTML output" in text["text"]

    assert typo["tool_use_id"] == "toolu_01Ua8sE5kYw3Pf7Jd1Gn4ZcM" and typo["is_error"] is True
    [text] = typo["content"]
    assert text["text"].startswith("error: KeyError: 'regoin'\ntraceback")
    assert "----> 1 per_region = orders.groupby('regoin')" in text["text"]

    assert chart["is_error"] is False
    text, image = chart["content"]
    for region, revenue in expected.items():
        assert f"'{region}': {revenue}" in text["text"]
    assert "displayed: 1 image (image/png)" in text["text"]
    assert "files: created revenue.png" in text["text"]
    assert image["type"] == "image" and image["source"]["media_type"] == "image/png"
    assert base64.b64decode(image["source"]["data"]).startswith(PNG_MAGIC)
    json.dumps(messages)


def test_a_sdk_object_call_and_a_bad_one(session: Session) -> None:
    from pydantic import BaseModel

    class ToolUseBlock(BaseModel):  # the shape of anthropic.types.ToolUseBlock
        id: str
        input: dict[str, Any]
        name: str
        type: str

    ok = run_tool_call(
        session,
        ToolUseBlock(id="toolu_x", name="run_python", type="tool_use", input={"code": "print('from an SDK object')"}),
    )
    assert ok["content"] == [{"type": "text", "text": "stdout:\nfrom an SDK object"}]
    bad = run_tool_call(
        session, {"id": "call_y", "type": "function", "function": {"name": "run_python", "arguments": '{"code": "1 +'}}
    )
    assert bad["content"].startswith("error: invalid arguments for run_python: the arguments are not valid JSON")
    # nothing ran for the bad call
    assert session.info().execution_count == 1
