"""The fan-out numbers an event whose model it lets go by writing ``seq`` into
its JSON rather than copying the model: the text must be the very text of the
numbered copy, for every event type."""

from __future__ import annotations

import json

from kernelgw import events as ev
from kernelgw.runtime.fanout import EventFanout, numbered_json
from tests.unit.runtime.conftest import session_config

EVENTS: list[ev.Event] = [
    ev.Queued(execution_id="e1", code="1+1 # é \U0001f600", position=2),
    ev.Status(execution_id="e1", state="busy"),
    ev.Stream(execution_id="e1", name="stdout", text='quotes " and {"seq":null} inside\n'),
    ev.Display(execution_id="e1", data={"text/plain": "x", "image/png": "iVBOR"}, metadata={"a": [1, None]}),
    ev.UpdateDisplay(execution_id="e1", data={"text/plain": "y"}, display_id="d"),
    ev.Result(execution_id="e1", execution_count=3, data={"text/plain": "2"}),
    ev.ClearOutput(execution_id="e1", wait=True),
    ev.Truncated(execution_id="e1", limit_bytes=10, message="cut"),
    ev.Replay(phase="started", trigger="requested", cells=2),
    ev.Gap(first_missing=1, last_missing=4),
    ev.ProtocolError(message="bad"),
    ev.Error(execution_id="e1", ename="E", evalue="v", traceback=["t"], traceback_text=["t"]),
    ev.Done(execution_id="e1", status="ok", duration_ms=1.5),
    ev.Late(execution_id="e1", event=ev.Stream(execution_id="e1", name="stdout", text="after\n")),
]


def test_numbered_json_is_the_numbered_copys_text_for_every_event_type() -> None:
    assert {e.type for e in EVENTS} == ev.EVENT_TYPES
    for event in EVENTS:
        for seq in (1, 12345678901):
            assert numbered_json(event, seq) == event.model_copy(update={"seq": seq}).model_dump_json()
    renumbered = ev.Status(seq=7, execution_id="e1", state="idle")  # numbered already: copied as before
    assert json.loads(numbered_json(renumbered, 8))["seq"] == 8


def test_published_events_carry_their_number_and_kept_models_stay() -> None:
    fanout = EventFanout(session_config())
    sub = fanout.subscribe()
    pubs = [fanout.publish(event) for event in EVENTS]
    assert [json.loads(p.json)["seq"] for p in pubs] == list(range(1, len(EVENTS) + 1))
    assert [sub.queue.get_nowait() for _ in pubs] == [p.json for p in pubs]
    kept = [p.event for p in pubs if p.event is not None]
    assert [type(e) for e in kept] == [ev.Error, ev.Done] and [e.seq for e in kept] == [12, 13]
