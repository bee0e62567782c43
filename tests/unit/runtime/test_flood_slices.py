"""A flood is handed over in slices: the Python kernel sends no stream message
over `MAX_STREAM_CHARS` (kernelgw_kernel.launcher), and a running cell's output
is checkpointed less often as it grows (`checkpoint_due`).

The kernel side runs a real ipykernel with the image's launcher
(tests/support/local_backend.py); the pure parts are imported from images/python.
"""

from __future__ import annotations

from types import ModuleType

from kernelgw.runtime.execution import CHECKPOINT_FREE_BYTES, LARGE_CHECKPOINT_S, QueuedExecution, checkpoint_due
from kernelgw.runtime.fanout import Published
from tests.unit.runtime.conftest import SessionFactory
from tests.unit.runtime.test_session import run


def test_sliced_keeps_short_texts_and_cuts_long_ones_in_order(launcher: ModuleType) -> None:
    buffers = [({"msg_id": "a"}, "short"), ({"msg_id": "b"}, "0123456789"), ({"msg_id": "c"}, "")]
    got = list(launcher.sliced(lambda: iter(buffers), limit=4)())
    assert got == [
        ({"msg_id": "a"}, "shor"),
        ({"msg_id": "a"}, "t"),
        ({"msg_id": "b"}, "0123"),
        ({"msg_id": "b"}, "4567"),
        ({"msg_id": "b"}, "89"),
        ({"msg_id": "c"}, ""),  # left as it was: ipykernel skips empty texts itself
    ]


async def test_one_large_print_reaches_the_gateway_in_slices_and_whole(
    new_session: SessionFactory, launcher: ModuleType
) -> None:
    session = await new_session()
    events = await run(session, "print('x' * 1_000_000)")
    texts = [e["text"] for e in events if e["type"] == "stream"]
    assert "".join(texts) == "x" * 1_000_000 + "\n"
    # one message of 1,000,001 characters before; the gateway would have passed it on whole
    assert len(texts) >= 4 and max(map(len, texts)) <= launcher.MAX_STREAM_CHARS, [len(t) for t in texts]


def rec_with(output_bytes: int, published: int, checkpointed: int, checkpointed_bytes: int) -> QueuedExecution:
    rec = QueuedExecution.__new__(QueuedExecution)  # no event loop needed for the fields read
    rec.published = [Published.__new__(Published) for _ in range(published)]
    rec.output_bytes, rec.checkpointed, rec.checkpointed_bytes = output_bytes, checkpointed, checkpointed_bytes
    rec.checkpointed_at = 0.0
    return rec


LATER = LARGE_CHECKPOINT_S


def test_a_checkpoint_needs_new_events() -> None:
    assert not checkpoint_due(rec_with(10, published=3, checkpointed=3, checkpointed_bytes=0), LATER)
    assert checkpoint_due(rec_with(10, published=4, checkpointed=3, checkpointed_bytes=5), 0.1)


def test_large_output_is_checkpointed_when_it_has_grown_by_half_and_not_often() -> None:
    big = 8 * CHECKPOINT_FREE_BYTES
    assert not checkpoint_due(rec_with(big + big // 2 - 1, published=9, checkpointed=3, checkpointed_bytes=big), LATER)
    assert checkpoint_due(rec_with(big + big // 2, published=9, checkpointed=3, checkpointed_bytes=big), LATER)
    assert not checkpoint_due(rec_with(big * 2, published=9, checkpointed=3, checkpointed_bytes=big), LATER - 0.1)


def test_checkpoints_of_a_long_flood_write_at_most_three_times_its_output() -> None:
    """Output growing 256 KiB per poll up to 64 MiB: what all checkpoints write in sum."""
    rec, written = rec_with(0, published=1, checkpointed=1, checkpointed_bytes=0), 0
    for poll in range(256):  # a poll every LARGE_CHECKPOINT_S: only the growth rule decides
        now = (poll + 1) * LARGE_CHECKPOINT_S
        rec.output_bytes += 256 * 1024
        rec.published.append(Published.__new__(Published))
        if checkpoint_due(rec, now):
            rec.checkpointed, rec.checkpointed_bytes = len(rec.published), rec.output_bytes
            rec.checkpointed_at = now
            written += rec.output_bytes
    assert written <= 3 * rec.output_bytes + 4 * CHECKPOINT_FREE_BYTES
    assert rec.checkpointed_bytes >= rec.output_bytes * 2 // 3  # and not far behind
