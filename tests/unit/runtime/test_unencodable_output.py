"""Output holding a lone surrogate (a code point UTF-8 cannot encode) is
delivered with U+FFFD in its place, and nothing else of the cell is lost.

Two sides, each tested with a real ipykernel (tests/support/local_backend.py):
the kernel's packer (kernelgw_kernel.launcher.json_packer) replaces
surrogates before sending, and the gateway (kernelgw.events) replaces any
that a kernel still sends (a kernel whose code swaps the packer for one that
writes ``\\ud800`` escapes), so every event can be sent and stored.
"""

from __future__ import annotations

import json
from typing import Any

from kernelgw import events as ev
from kernelgw.runtime.session import KernelSession
from kernelgw.storage.store import Store
from tests.unit.runtime.conftest import SessionFactory, recording
from tests.unit.runtime.test_session import run, stdout

ESCAPING_PACKER = """
import json
from jupyter_client.session import json_default
get_ipython().kernel.session.pack = lambda o: json.dumps(o, default=json_default).encode('ascii')
"""
"""Kernel code: from now on the kernel sends JSON with ``\\uXXXX`` escapes,
which carry lone surrogates to the gateway intact."""


def text_of(events: list[dict[str, Any]], name: str) -> str:
    return "".join(e["text"] for e in events if e["type"] == "stream" and e["name"] == name)


def encodable(value: Any) -> None:
    """Valid UTF-8 JSON text all the way (raises otherwise)."""
    json.dumps(value, ensure_ascii=False).encode("utf-8")


async def stored_events(store: Store, session: KernelSession, execution_id: str) -> list[dict[str, Any]]:
    (row,) = [e for e in await store.list_executions(session.id) if e.execution_id == execution_id]
    events: list[dict[str, Any]] = json.loads(row.events_json)
    return events


# ------------------------------------------------------------------ pure


def test_without_surrogates_replaces_each_one_and_keeps_the_rest() -> None:
    assert ev.without_surrogates("a\ud800b\udcffc\U0001f600") == "a\ufffdb\ufffdc\U0001f600"
    value = {"k\udfff": ["x", {"y": "\ud800"}], "n": 1, "ok": "é"}
    assert ev.without_surrogates(value) == {"k\ufffd": ["x", {"y": "\ufffd"}], "n": 1, "ok": "é"}
    assert value["k\udfff"] == ["x", {"y": "\ud800"}], "the input is not changed"
    clean = {"a": ["é", {"b": "\U0001f600"}]}
    assert ev.without_surrogates(clean) is clean


def test_without_surrogates_does_not_recurse() -> None:
    deep: Any = "\ud800"
    for _ in range(100_000):
        deep = [deep]
    out = ev.without_surrogates(deep)
    for _ in range(100_000):
        out = out[0]
    assert out == "\ufffd"


def test_events_and_artifacts_never_hold_a_surrogate() -> None:
    error = ev.Error(ename="E\ud800", evalue="v\udcff", traceback=["t\ud800"], traceback_text=["t\ud800"])
    display = ev.Display(data={"text/plain": "d\ud800"}, metadata={"m\udfff": {"x": ["\ud800"]}})
    done = ev.Done(
        status="error",
        duration_ms=1,
        reason="r\ud800",
        artifacts=[{"path": "\udcff.txt", "size": 1, "mime_type": "text/plain", "change": "created"}],
    )
    for event in (error, display, done):
        encodable(json.loads(event.model_dump_json()))
    assert error.evalue == "v\ufffd" and display.metadata == {"m\ufffd": {"x": ["\ufffd"]}}
    assert done.artifacts[0].path == "\ufffd.txt" and done.reason == "r\ufffd"


# ------------------------------------------------------- the kernel's packer


async def test_the_kernel_sends_output_with_a_surrogate_replaced(new_session: SessionFactory, store: Store) -> None:
    session = await recording(new_session, store)
    events = await run(session, "print('ok'); print('\\ud800'); print('after')")
    assert events[-1]["status"] == "ok" and events[-1]["reason"] is None, events[-1]
    assert stdout(events) == "ok\n\ufffd\nafter\n"
    assert stdout(await stored_events(store, session, events[-1]["execution_id"])) == "ok\n\ufffd\nafter\n"

    events = await run(session, "import sys\nsys.stderr.write('e\\ud800\\n')\nprint('out')")
    assert text_of(events, "stderr") == "e\ufffd\n" and stdout(events) == "out\n", events

    code = "from IPython.display import display\ndisplay({'text/plain': 'd\\ud800'}, raw=True)\nprint('after')"
    events = await run(session, code)
    assert events[-1]["status"] == "ok", events[-1]
    assert [e["data"]["text/plain"] for e in events if e["type"] == "display"] == ["d\ufffd"]
    assert stdout(events) == "after\n"

    events = await run(session, "print('before')\nraise ValueError('bad \\ud800 value')")
    assert events[-1]["status"] == "error" and events[-1]["reason"] == "ValueError: bad \ufffd value", events[-1]
    (error,) = [e for e in events if e["type"] == "error"]
    assert error["ename"] == "ValueError" and error["evalue"] == "bad \ufffd value"
    assert "ValueError: bad \ufffd value" in error["traceback_text"][-1]
    assert stdout(events) == "before\n"
    encodable(await stored_events(store, session, events[-1]["execution_id"]))


# ------------------------------------------------------ the gateway's events


async def test_the_gateway_replaces_surrogates_a_kernel_sends(new_session: SessionFactory, store: Store) -> None:
    session = await recording(new_session, store)
    assert (await run(session, ESCAPING_PACKER))[-1]["status"] == "ok"

    events = await run(session, "print('ok'); print('\\ud800'); print('after')")
    assert events[-1]["status"] == "ok" and events[-1]["reason"] is None, events[-1]
    assert stdout(events) == "ok\n\ufffd\nafter\n"

    code = (
        "from IPython.display import display\n"
        "display({'text/plain': 'd\\ud800'}, metadata={'k\\udfff': ['v\\ud800']}, raw=True)\n"
        "open(b'\\xff.txt', 'w').write('x')\n"
        "print('after')"
    )
    events = await run(session, code)
    assert events[-1]["status"] == "ok", events[-1]
    (display,) = [e for e in events if e["type"] == "display"]
    assert display["data"] == {"text/plain": "d\ufffd"} and display["metadata"] == {"k\ufffd": ["v\ufffd"]}
    assert stdout(events) == "after\n"
    assert [a["path"] for a in events[-1]["artifacts"]] == ["\ufffd.txt"]

    events = await run(session, "raise ValueError('bad \\ud800 value')")
    done = events[-1]
    assert done["status"] == "error" and done["reason"] == "ValueError: bad \ufffd value", done
    (error,) = [e for e in events if e["type"] == "error"]
    assert error["evalue"] == "bad \ufffd value"
    stored = await stored_events(store, session, done["execution_id"])
    assert stored[-1]["reason"] == "ValueError: bad \ufffd value"
    encodable(stored)

    after = await run(session, "print('next')")
    assert stdout(after) == "next\n" and after[-1]["reason"] is None
