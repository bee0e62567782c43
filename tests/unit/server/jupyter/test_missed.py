"""What a returning Jupyter client is sent for one stored cell (pure logic):
busy, the cell's output rebuilt from its events (status events are the replay's
own), its execute_reply, idle, all with the request's header as parent."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from kernelgw.server.jupyter.missed import stored_messages
from kernelgw.storage.records import ExecutionRecord

HEADER = {"msg_id": "m1", "msg_type": "execute_request", "session": "tab", "username": "u", "version": "5.3"}


def record(status: str, events: list[dict[str, Any]], reason: str | None = None) -> ExecutionRecord:
    return ExecutionRecord(
        session_id="s",
        position=0,
        execution_id="m1",
        seq=1,
        code="x",
        status=status,
        execution_count=3,
        started_at=datetime.now(UTC),
        duration_ms=1.0,
        reason=reason,
        state_lost=False,
        events_json=json.dumps(events),
        client_session="tab",
        client_header=HEADER,
    )


def shown(messages: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    assert all(msg["parent_header"] == HEADER for _, msg in messages)
    out: list[Any] = []
    for channel, msg in messages:
        kind, content = msg["header"]["msg_type"], msg["content"]
        if kind == "status":
            out.append(content["execution_state"])
        elif kind == "stream":
            out.append((channel, "stream", content["text"]))
        elif kind == "execute_reply":
            out.append((channel, "reply", content["status"], content["execution_count"], content.get("ename")))
        elif kind == "error":
            out.append((channel, "error", content["ename"], content["evalue"]))
        else:
            out.append((channel, kind))
    return out


def test_an_ok_cell_with_output_and_a_result() -> None:
    events = [
        {"type": "queued", "execution_id": "m1", "seq": 1},
        {"type": "status", "execution_id": "m1", "state": "busy", "seq": 2},
        {"type": "stream", "execution_id": "m1", "name": "stdout", "text": "hi\n", "seq": 3},
        {"type": "result", "execution_id": "m1", "data": {"text/plain": "42"}, "execution_count": 3, "seq": 4},
        {"type": "status", "execution_id": "m1", "state": "idle", "seq": 5},
        {"type": "done", "execution_id": "m1", "status": "ok", "seq": 6},
    ]
    assert shown(stored_messages(record("ok", events))) == [
        "busy",
        ("iopub", "stream", "hi\n"),
        ("iopub", "execute_result"),
        ("shell", "reply", "ok", 3, None),
        "idle",
    ]


def test_a_failed_cell_replies_with_its_own_error() -> None:
    error = {"type": "error", "execution_id": "m1", "ename": "ZeroDivisionError", "evalue": "division by zero"}
    events = [{**error, "traceback": ["tb"], "seq": 2}]
    assert shown(stored_messages(record("error", events))) == [
        "busy",
        ("iopub", "error", "ZeroDivisionError", "division by zero"),
        ("shell", "reply", "error", 3, "ZeroDivisionError"),
        "idle",
    ]


def test_a_cell_cut_off_by_the_gateway_says_why() -> None:
    events = [{"type": "stream", "execution_id": "m1", "name": "stdout", "text": "before\n", "seq": 2}]
    assert shown(stored_messages(record("dead", events, reason="the gateway stopped"))) == [
        "busy",
        ("iopub", "stream", "before\n"),
        ("iopub", "error", "KernelGatewayError", "the gateway stopped"),
        ("shell", "reply", "error", 3, "KernelGatewayError"),
        "idle",
    ]


def test_malformed_stored_events_are_skipped_not_fatal() -> None:
    bad = record("ok", [])
    bad = ExecutionRecord(**{**bad.__dict__, "events_json": '[{"type": "stream"}, 7, "x"'})
    assert shown(stored_messages(bad)) == ["busy", ("shell", "reply", "ok", 3, None), "idle"]
    partial = ExecutionRecord(**{**bad.__dict__, "events_json": '[{"type": "stream"}, 7]'})
    assert shown(stored_messages(partial)) == ["busy", ("shell", "reply", "ok", 3, None), "idle"]


def test_late_output_is_the_cells_own_where_it_was_stored() -> None:
    """A cell a kept kernel ran on after a gateway stop, followed to its end by the
    next gateway: its later output is stored as ``late`` after its interim done,
    and its status is its real one (it was once dropped from the replay: the
    client got ``ok`` without the output)."""
    late = {"type": "late", "execution_id": "m1", "seq": 5}
    events = [
        {"type": "stream", "execution_id": "m1", "name": "stdout", "text": "before\n", "seq": 2},
        {"type": "done", "execution_id": "m1", "status": "dead", "reason": "the gateway stopped", "seq": 4},
        {**late, "event": {"type": "stream", "execution_id": "m1", "name": "stdout", "text": "after\n", "seq": None}},
    ]
    assert shown(stored_messages(record("ok", events))) == [
        "busy",
        ("iopub", "stream", "before\n"),
        ("iopub", "stream", "after\n"),
        ("shell", "reply", "ok", 3, None),
        "idle",
    ]
    error = {"type": "error", "execution_id": "m1", "ename": "ValueError", "evalue": "late", "traceback": ["tb"]}
    failed = [*events[:2], {**late, "event": {**error, "seq": None}}]
    assert shown(stored_messages(record("error", failed))) == [
        "busy",
        ("iopub", "stream", "before\n"),
        ("iopub", "error", "ValueError", "late"),
        ("shell", "reply", "error", 3, "ValueError"),
        "idle",
    ]
