"""Sequence numbers, replay buffer, resume and slow-subscriber handling.

These exercise the session's in-memory fan-out only: no kernel is started.
"""

from __future__ import annotations

import json

from kernelgw import events as ev
from kernelgw.runtime.backends.base import KernelSpec
from kernelgw.runtime.session import KernelSession, SessionConfig, Subscription


def make_session(replay: int = 5, queue: int = 100) -> KernelSession:
    spec = KernelSpec("s", "img", 256, 1.0, 64, 16, 16, 16)
    config = SessionConfig(
        exec_timeout_s=10,
        max_exec_timeout_s=20,
        interrupt_grace_s=1,
        kernel_start_timeout_s=5,
        max_output_bytes=1000,
        replay_buffer=replay,
        subscriber_queue=queue,
        state_poll_s=0.1,
    )
    return KernelSession("s", spec, backend=None, config=config)  # type: ignore[arg-type]


def drain(sub: Subscription) -> list[dict]:
    out = []
    while not sub.queue.empty():
        item = sub.queue.get_nowait()
        if item is not None:
            out.append(json.loads(item))
    return out


async def test_publish_numbers_events_and_fans_out() -> None:
    session = make_session()
    a, b = session.subscribe(), session.subscribe()
    for i in range(3):
        session._fanout.publish(ev.Stream(execution_id="x", name="stdout", text=str(i)))
    assert [e["seq"] for e in drain(a)] == [1, 2, 3]
    assert [e["text"] for e in drain(b)] == ["0", "1", "2"]


async def test_resume_replays_only_newer_events() -> None:
    session = make_session()
    for i in range(4):
        session._fanout.publish(ev.Stream(name="stdout", text=str(i)))
    sub = session.subscribe(last_seq=2)
    assert [e["seq"] for e in drain(sub)] == [3, 4]
    session._fanout.publish(ev.Stream(name="stdout", text="live"))
    assert [e["seq"] for e in drain(sub)] == [5]


async def test_resume_beyond_buffer_starts_with_a_gap() -> None:
    session = make_session(replay=3)
    for i in range(6):
        session._fanout.publish(ev.Stream(name="stdout", text=str(i)))
    events = drain(session.subscribe(last_seq=1))
    assert events[0] == {"type": "gap", "seq": None, "execution_id": None, "first_missing": 2, "last_missing": 3}
    assert [e["seq"] for e in events[1:]] == [4, 5, 6]


async def test_replay_buffer_is_bounded_by_bytes() -> None:
    session = make_session(replay=1000)
    session.config.replay_buffer_bytes = 1000
    for i in range(10):
        session._fanout.publish(ev.Stream(name="stdout", text=f"{i}" * 200))
    kept = [seq for seq, _ in session._fanout.replay]
    assert kept and kept[-1] == 10 and len(kept) < 10
    assert session._fanout.replay_bytes == sum(len(text) for _, text in session._fanout.replay) <= 1000
    events = drain(session.subscribe(last_seq=0))
    assert events[0]["type"] == "gap" and events[0]["last_missing"] == kept[0] - 1


async def test_up_to_date_client_gets_nothing_replayed() -> None:
    session = make_session()
    session._fanout.publish(ev.Stream(name="stdout", text="x"))
    assert drain(session.subscribe(last_seq=1)) == []


async def test_slow_subscriber_is_dropped_without_affecting_others() -> None:
    session = make_session(queue=3)
    slow, fast = session.subscribe(), session.subscribe()
    fast_seen = []
    for i in range(10):
        session._fanout.publish(ev.Stream(name="stdout", text=str(i)))
        fast_seen += drain(fast)
    assert slow.overflowed and slow.closed
    assert session.subscriber_count == 1
    assert [e["seq"] for e in fast_seen] == list(range(1, 11))
    # a dropped client gets nothing more, not even its stale backlog
    assert await slow.get() is None


async def test_subscriber_is_bounded_by_bytes_too() -> None:
    sub = Subscription(maxsize=1000, max_bytes=100)
    sub.offer("x" * 60)
    assert not sub.overflowed
    sub.offer("y" * 60)
    assert sub.overflowed and sub.closed
    # consuming frees the budget on a live subscription
    live = Subscription(maxsize=1000, max_bytes=100)
    live.offer("x" * 60)
    assert await live.get() == "x" * 60
    live.offer("y" * 60)
    assert not live.overflowed and live.queued_bytes == 60


# ------------------------------------------------------------- continuing a stream after a restart


def stored(seqs: list[int]) -> list[tuple[int, str]]:
    return [(seq, ev.Stream(name="stdout", text=str(seq), seq=seq).model_dump_json()) for seq in seqs]


async def test_a_seeded_stream_replays_what_was_stored_and_numbers_on_after_it() -> None:
    session = make_session(replay=10)
    session._fanout.seed(stored([1, 2, 3]), seq=3)  # a clean stop: the reservation is the last seq
    events = drain(session.subscribe(last_seq=1))
    assert [e["seq"] for e in events] == [2, 3]
    assert session._fanout.publish(ev.Stream(name="stdout", text="new")).seq == 4


async def test_numbers_a_crash_may_have_used_are_a_gap_to_a_resuming_client() -> None:
    session = make_session(replay=10)
    session._fanout.seed(stored([1, 2, 3]), seq=10_003)  # the stored reservation after a kill -9
    session._fanout.publish(ev.Stream(name="stdout", text="after the restart"))
    events = drain(session.subscribe(last_seq=2))
    assert [(e["type"], e["seq"]) for e in events] == [("stream", 3), ("gap", None), ("stream", 10_004)]
    assert (events[1]["first_missing"], events[1]["last_missing"]) == (4, 10_003)
    # a client that saw numbers the dead process sent and never stored: a gap, never a repeat
    events = drain(session.subscribe(last_seq=7))
    assert [(e["type"], e["seq"]) for e in events] == [("gap", None), ("stream", 10_004)]
    assert (events[0]["first_missing"], events[0]["last_missing"]) == (8, 10_003)


async def test_a_seeded_replay_keeps_its_bounds() -> None:
    session = make_session(replay=3)
    session._fanout.seed(stored(list(range(1, 11))), seq=10)
    assert [seq for seq, _ in session._fanout.replay] == [8, 9, 10]


async def test_the_reservation_is_renewed_half_a_block_ahead() -> None:
    from kernelgw.runtime.fanout import SEQ_BLOCK

    session = make_session(replay=1)
    renewed: list[int] = []
    session._fanout.on_reserve = lambda: renewed.append(session._fanout.reserved)
    assert session.resume_seq == SEQ_BLOCK  # a new session's row is written with a whole block reserved
    for _ in range(SEQ_BLOCK // 2):
        session._fanout.publish(ev.Stream(name="stdout", text="."))
    assert renewed == []
    session._fanout.publish(ev.Stream(name="stdout", text="."))
    assert renewed == [SEQ_BLOCK // 2 + 1 + SEQ_BLOCK]
    assert session.resume_seq > session.last_seq
