"""The event schema is the public contract: round trips and rejections."""

from __future__ import annotations

import typing

import pytest
from pydantic import ValidationError

from kernelgw import events as ev


def test_every_event_round_trips_through_json() -> None:
    samples: list[ev.Event] = [
        ev.Queued(seq=1, execution_id="x", code="1+1", position=0),
        ev.Status(seq=2, execution_id="x", state="busy"),
        ev.Stream(seq=3, execution_id="x", name="stdout", text="hi\n"),
        ev.Display(seq=4, execution_id="x", data={"image/png": "AAAA"}, display_id="d"),
        ev.UpdateDisplay(seq=5, execution_id="x", data={"text/plain": "2"}, display_id="d"),
        ev.Result(seq=6, execution_id="x", execution_count=1, data={"text/plain": "2"}),
        ev.ClearOutput(seq=7, execution_id="x", wait=True),
        ev.Error(seq=8, execution_id="x", ename="E", evalue="v", traceback=["t"], traceback_text=["t"]),
        ev.Truncated(seq=9, execution_id="x", limit_bytes=10, message="cut"),
        ev.Done(seq=10, execution_id="x", status="timeout", duration_ms=1.5, reason="r", state_lost=True),
        ev.Late(seq=10, execution_id="x", event=ev.Stream(execution_id="x", name="stdout", text="after\n")),
        ev.Replay(seq=11, phase="started", trigger="kernel_died", cells=2),
        ev.Replay(seq=12, execution_id="y", phase="cell", trigger="kernel_died", cells=2, index=0, replay_of="x"),
        ev.Replay(seq=20, phase="finished", trigger="requested", cells=2, replayed=1, duration_ms=12.5),
        ev.Gap(first_missing=1, last_missing=3),
        ev.ProtocolError(message="bad"),
    ]
    for event in samples:
        assert ev.parse_event(event.model_dump_json()) == event
        assert ev.parse_event(event.model_dump()) == event
    union = typing.get_args(typing.get_args(ev.Event)[0])
    assert {e.type for e in samples} == {m.model_fields["type"].default for m in union}


def test_unknown_type_and_extra_fields_are_rejected() -> None:
    with pytest.raises(ValidationError):
        ev.parse_event({"type": "nope"})
    with pytest.raises(ValidationError):
        ev.parse_event({"type": "stream", "name": "stdout", "text": "x", "surprise": 1})
    with pytest.raises(ValidationError):
        ev.parse_event({"type": "done", "status": "maybe", "duration_ms": 1})


def test_events_are_immutable() -> None:
    event = ev.Stream(name="stdout", text="x")
    with pytest.raises(ValidationError):
        event.text = "y"  # type: ignore[misc]
