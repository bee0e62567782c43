"""A flood is handed over in slices: the Python kernel sends no stream message
over `MAX_STREAM_CHARS` (kernelgw_kernel.launcher), and a running cell's output
is handed to the store whenever it has new events (`checkpoint_due`), which
stores it in chunks (tests/unit/storage/test_output_chunks.py).

The kernel side runs a real ipykernel with the image's launcher
(tests/support/local_backend.py); the pure parts are imported from images/python.
"""

from __future__ import annotations

from types import ModuleType

from kernelgw.runtime.execution import QueuedExecution, checkpoint_due
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


def rec_with(published: int, released: int, checkpointed: int) -> QueuedExecution:
    rec = QueuedExecution.__new__(QueuedExecution)  # no event loop needed for the fields read
    rec.published = [Published.__new__(Published) for _ in range(published)]
    rec.released, rec.checkpointed = released, checkpointed
    return rec


def test_a_checkpoint_needs_events_the_store_was_not_handed() -> None:
    assert not checkpoint_due(rec_with(published=3, released=0, checkpointed=3))
    assert checkpoint_due(rec_with(published=4, released=0, checkpointed=3))
    # events released after their chunk was committed still count as handed over
    assert not checkpoint_due(rec_with(published=1, released=5, checkpointed=6))
    assert checkpoint_due(rec_with(published=2, released=5, checkpointed=6))
