"""Reading a kernel's messages: what is refused, and bursts read at once (real ZMQ sockets)."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator

import pytest
import zmq
import zmq.asyncio
from jupyter_client.session import DELIM, Session

from kernelgw import events as ev
from kernelgw.runtime.iopub import to_event
from kernelgw.runtime.kernel_messages import (
    COALESCE_MAX_CHARS,
    TEXT_CHECKED,
    InvalidKernelMessage,
    KernelMessageReader,
    KernelMessageSender,
    ReaderClosed,
    SignatureHistory,
    coalesce_streams,
    decode,
)

KEY = uuid.uuid4().hex.encode()


Pipe = tuple[zmq.asyncio.Socket, zmq.asyncio.Socket]


@pytest.fixture
def pipe() -> Iterator[Pipe]:
    """A PULL socket and the PUSH socket connected to it (inproc), closed after the test."""
    ctx = zmq.asyncio.Context()
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    address = f"inproc://{uuid.uuid4().hex}"
    pull.bind(address)
    push.connect(address)
    yield pull, push
    pull.close(0)
    push.close(0)
    ctx.term()


def frames(session: Session, msg_type: str = "stream", content: dict[str, object] | None = None) -> list[bytes]:
    msg = session.msg(msg_type, content or {"name": "stdout", "text": "hi\n"}, parent={"msg_id": "p1"})
    return [bytes(f) for f in session.serialize(msg)]


def test_a_signed_message_decodes_like_jupyter_clients_with_its_date_as_sent() -> None:
    kernel, gateway = Session(key=KEY), Session(key=KEY)
    sent = frames(kernel)
    ours = decode(sent, gateway.auth, SignatureHistory())
    theirs = Session(key=KEY).deserialize(sent[sent.index(DELIM) + 1 :])
    for part in ("content", "metadata", "msg_id", "msg_type"):
        assert ours[part] == theirs[part]
    assert ours["parent_header"] == {"msg_id": "p1"}
    assert ours["header"]["date"] == theirs["header"]["date"].isoformat().replace("+00:00", "Z")


def test_forged_replayed_and_malformed_messages_are_refused() -> None:
    kernel, gateway, history = Session(key=KEY), Session(key=KEY), SignatureHistory()
    forged = frames(Session(key=b"not the key"))
    with pytest.raises(InvalidKernelMessage, match="invalid signature"):
        decode(forged, gateway.auth, history)
    good = frames(kernel)
    decode(good, gateway.auth, history)
    with pytest.raises(InvalidKernelMessage, match="seen before"):
        decode(good, gateway.auth, history)
    unsigned = list(frames(kernel))
    unsigned[unsigned.index(DELIM) + 1] = b""
    with pytest.raises(InvalidKernelMessage, match="unsigned"):
        decode(unsigned, gateway.auth, history)
    with pytest.raises(InvalidKernelMessage, match="delimiter"):
        decode([f for f in frames(kernel) if f != DELIM], gateway.auth, history)
    with pytest.raises(InvalidKernelMessage, match="at least 5"):
        decode(frames(kernel)[:4], gateway.auth, history)
    broken = Session(key=KEY)
    body = [b'{"msg_id": "x", "msg_type": "stream"}', b"{}", b"{}", b"not json"]
    with pytest.raises(InvalidKernelMessage, match="content is not JSON"):
        decode([DELIM, broken.sign(body), *body], gateway.auth, history)
    body = [b'{"msg_id": "x"}', b"{}", b"{}", b"{}"]
    with pytest.raises(InvalidKernelMessage, match="msg_type"):
        decode([DELIM, broken.sign(body), *body], gateway.auth, history)


def test_skipped_content_is_left_undecoded_but_the_message_is_still_checked() -> None:
    kernel, gateway, history = Session(key=KEY), Session(key=KEY), SignatureHistory()
    asked: list[tuple[str, str | None]] = []

    def skip(msg_type: str, parent: str | None) -> bool:
        asked.append((msg_type, parent))
        return msg_type == "stream"

    skipped = decode(frames(kernel), gateway.auth, history, skip)
    assert skipped["content"] == {} and skipped["metadata"] == {} and skipped["content_skipped"]
    assert skipped["msg_type"] == "stream" and skipped["parent_header"] == {"msg_id": "p1"}
    kept = decode(frames(kernel, "display_data", {"data": {"text/plain": "1"}}), gateway.auth, history, skip)
    assert kept["content"] == {"data": {"text/plain": "1"}} and "content_skipped" not in kept
    assert asked == [("stream", "p1"), ("display_data", "p1")]
    # the signature covers the content that is not decoded: a forgery is still refused
    forged = frames(kernel)
    forged[-1] = b'{"name": "stdout", "text": "forged"}'
    with pytest.raises(InvalidKernelMessage, match="invalid signature"):
        decode(forged, gateway.auth, history, skip)


def test_an_escaped_lone_surrogate_is_parsed_as_jupyter_client_does() -> None:
    session = Session(key=KEY)
    body = [b'{"msg_id": "m", "msg_type": "stream"}', b"{}", b"{}", b'{"text": "a\\ud800b"}']
    msg = decode([DELIM, session.sign(body), *body], session.auth, SignatureHistory())
    assert msg["content"] == {"text": "a\ud800b"}


def test_signature_history_forgets_the_oldest() -> None:
    history = SignatureHistory(size=2)
    assert history.add(b"a") and history.add(b"b") and history.add(b"c")
    assert history.add(b"a")  # forgotten
    assert not history.add(b"c")


async def test_a_burst_is_read_in_one_batch_and_bad_messages_do_not_stop_the_reader(pipe: Pipe) -> None:
    pull, push = pipe
    kernel, dropped = Session(key=KEY), []
    reader = KernelMessageReader(pull, Session(key=KEY), dropped.append, max_batch=4)
    await push.send_multipart(frames(Session(key=b"forger")))
    for i in range(6):
        await push.send_multipart(frames(kernel, content={"name": "stdout", "text": f"{i}\n"}))
    # all queued before the first read: an inproc send puts the message in the pipe
    # before it returns, and the pipe is readable (a wait on that, not a sleep)
    assert await pull.poll(5000) == zmq.POLLIN
    first = await asyncio.wait_for(reader.batch(), 5)
    second = await asyncio.wait_for(reader.batch(), 5)
    assert [m["content"]["text"] for m in first] == ["0\n", "1\n", "2\n"]  # the forgery took a slot
    assert [m["content"]["text"] for m in second] == ["3\n", "4\n", "5\n"]
    assert len(dropped) == 1 and "invalid signature" in str(dropped[0])


def stream(parent: str, name: str, text: str) -> dict[str, object]:
    return {"msg_type": "stream", "parent_header": {"msg_id": parent}, "content": {"name": name, "text": text}}


def other(parent: str, msg_type: str = "display_data") -> dict[str, object]:
    return {"msg_type": msg_type, "parent_header": {"msg_id": parent}, "content": {"data": {}}}


def test_runs_of_one_requests_stream_are_merged_and_nothing_is_reordered() -> None:
    messages = [
        stream("a", "stdout", "1\n"),
        stream("a", "stdout", "2\n"),
        stream("a", "stderr", "e\n"),  # another stream: a new run
        stream("a", "stderr", "f\n"),
        other("a"),  # a display between prints keeps its place
        stream("a", "stdout", "3\n"),
        stream("b", "stdout", "x\n"),  # another request: never merged into a's
        stream("b", "stdout", "y\n"),
    ]
    merged = coalesce_streams(messages)  # type: ignore[arg-type]
    assert [(m["msg_type"], m["parent_header"]["msg_id"], m["content"].get("text")) for m in merged] == [
        ("stream", "a", "1\n2\n"),
        ("stream", "a", "e\nf\n"),
        ("display_data", "a", None),
        ("stream", "a", "3\n"),
        ("stream", "b", "x\ny\n"),
    ]


def test_a_merged_stream_stays_within_its_bound() -> None:
    piece = "x" * (COALESCE_MAX_CHARS // 3 + 1)
    merged = coalesce_streams([stream("a", "stdout", piece) for _ in range(5)])  # type: ignore[arg-type]
    assert [len(m["content"]["text"]) for m in merged] == [2 * len(piece), 2 * len(piece), len(piece)]
    assert all(len(m["content"]["text"]) <= COALESCE_MAX_CHARS for m in merged)


def test_a_stream_message_without_text_is_not_merged() -> None:
    odd = {"msg_type": "stream", "parent_header": {"msg_id": "a"}, "content": {"name": "stdout", "text": 5}}
    merged = coalesce_streams([stream("a", "stdout", "1"), odd, stream("a", "stdout", "2")])  # type: ignore[list-item]
    assert [m["content"]["text"] for m in merged] == ["1", 5, "2"]


async def test_a_read_stops_taking_messages_once_it_holds_its_bytes(pipe: Pipe) -> None:
    pull, push = pipe
    kernel = Session(key=KEY)
    reader = KernelMessageReader(pull, Session(key=KEY), lambda exc: None, max_batch_bytes=25_000)
    for _ in range(4):
        await push.send_multipart(frames(kernel, content={"name": "stdout", "text": "x" * 10_000}))
    assert await pull.poll(5000) == zmq.POLLIN  # queued (inproc: in the pipe once sent)
    sizes = [len(await asyncio.wait_for(reader.batch(), 5)) for _ in range(2)]
    assert sizes == [3, 1]  # 10 kB, 20 kB, 30 kB: past the bound after the third


async def test_a_waiting_reader_wakes_for_each_message_and_stops_watching_once_closed(pipe: Pipe) -> None:
    """The reader waits on the socket's descriptor, not pyzmq's futures: messages
    sent while it waits, one at a time, each wake it."""
    pull, push = pipe
    kernel = Session(key=KEY)
    reader = KernelMessageReader(pull, Session(key=KEY), lambda exc: None)
    try:
        texts = []
        for i in range(20):
            waiting = asyncio.ensure_future(reader.batch())
            await asyncio.sleep(0.002)
            assert not waiting.done()  # nothing there yet: it waits
            await push.send_multipart(frames(kernel, content={"name": "stdout", "text": f"{i}\n"}))
            texts += [m["content"]["text"] for m in await asyncio.wait_for(waiting, 5)]
        assert texts == [f"{i}\n" for i in range(20)]
        fd = reader._fd
        assert fd >= 0
        waiting = asyncio.ensure_future(reader.batch())
        await asyncio.sleep(0.002)
        reader.close()
        with pytest.raises(ReaderClosed):
            await asyncio.wait_for(waiting, 5)
        with pytest.raises(OSError):
            os.fstat(fd)  # its duplicate descriptor is closed
    finally:
        reader.close()


async def test_a_read_cancelled_after_its_wake_leaves_the_message_for_the_next(pipe: Pipe) -> None:
    """A caller's timeout may cancel a read after `wake` answered it (and took the
    socket's signal): ZMQ signals no more while that message is unread, so the
    next read must find it without a signal (it waited forever: a session whose
    kernel had answered looked hung)."""
    pull, push = pipe
    kernel = Session(key=KEY)
    reader = KernelMessageReader(pull, Session(key=KEY), lambda exc: None)
    try:
        waiting = asyncio.ensure_future(reader.batch())
        await asyncio.sleep(0.01)
        assert not waiting.done()
        await push.send_multipart(frames(kernel, content={"name": "stdout", "text": "late\n"}))
        # inproc: the message is there at once, and asking takes the socket's
        # signal, with no turn of the loop in between that could answer the read
        assert reader._ready()
        reader.wake()  # as the loop would on the signal, answering the waiter...
        waiting.cancel()  # ...and the caller's timeout fires before the read resumes
        with pytest.raises(asyncio.CancelledError):
            await waiting
        got = await asyncio.wait_for(reader.batch(), 5)
        assert [m["content"]["text"] for m in got] == ["late\n"]
    finally:
        reader.close()


async def test_the_sender_sends_what_jupyter_clients_session_would_signed_by_the_session(pipe: Pipe) -> None:
    pull, push = pipe
    session = Session(key=KEY)
    sender = KernelMessageSender(push, session)
    msg_id = sender.execute("1+1", silent=False, store_history=True, user_expressions={"k": "v"}, stop_on_error=False)
    ours = await asyncio.wait_for(pull.recv_multipart(), 5)
    session.send(push, session.msg("execute_request", {"code": "1+1"}))
    theirs = await asyncio.wait_for(pull.recv_multipart(), 5)
    receiver = Session(key=KEY)
    msg = receiver.deserialize(receiver.feed_identities(ours)[1])  # checks the signature, as a kernel does
    assert msg["header"]["msg_id"] == msg_id and msg["msg_type"] == "execute_request"
    assert msg["content"] == {
        "code": "1+1",
        "silent": False,
        "store_history": True,
        "user_expressions": {"k": "v"},
        "allow_stdin": False,
        "stop_on_error": False,
    }
    assert len(ours) == len(theirs) and ours.index(DELIM) == theirs.index(DELIM)
    assert set(msg["header"]) == set(receiver.deserialize(receiver.feed_identities(theirs)[1])["header"])


def test_only_text_orjson_parsed_skips_the_surrogate_check_even_once_merged() -> None:
    """orjson refuses a lone surrogate, so what it parsed is marked checked; a
    message parsed the other way (an escaped ``\\ud800``) is not, and a stream run
    it joins is not either: its event still gets U+FFFD."""
    session = Session(key=KEY)
    clean = decode(frames(session, content={"name": "stdout", "text": "a"}), session.auth, SignatureHistory())
    assert clean[TEXT_CHECKED] is True
    raw = frames(session, content={"name": "stdout", "text": "b"})
    raw[-1] = raw[-1].replace(b'"b', b'"\\ud800')
    raw[raw.index(DELIM) + 1] = session.sign(raw[raw.index(DELIM) + 2 :])  # signed again, as a kernel would
    escaped = decode(raw, session.auth, SignatureHistory())
    assert escaped[TEXT_CHECKED] is False and escaped["content"]["text"] == "\ud800"
    assert to_event(clean, "e1") == ev.Stream(execution_id="e1", name="stdout", text="a")
    assert to_event(escaped, "e1") == ev.Stream(execution_id="e1", name="stdout", text="\ufffd")
    (merged,) = coalesce_streams([clean, escaped])
    assert merged[TEXT_CHECKED] is False
    assert to_event(merged, "e1") == ev.Stream(execution_id="e1", name="stdout", text="a\ufffd")


@pytest.fixture
def pair() -> Iterator[Pipe]:
    """The gateway's end and the kernel's end of a PAIR connection (inproc): the
    gateway both sends and reads on its socket, as on a kernel's shell."""
    ctx = zmq.asyncio.Context()
    ours, theirs = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    address = f"inproc://{uuid.uuid4().hex}"
    ours.bind(address)
    theirs.connect(address)
    yield ours, theirs
    ours.close(0)
    theirs.close(0)
    ctx.term()


async def test_a_send_wakes_the_reader_of_its_socket(pair: Pipe) -> None:
    """A send processes the socket's pending signals, so a message that arrived
    just before it signals the loop no more: the sender wakes the reader, or the
    read would wait for the next message (the kernel's reply to a request)."""
    ours, theirs = pair
    kernel, session = Session(key=KEY), Session(key=KEY)
    reader = KernelMessageReader(ours, session, lambda exc: None)
    sender = KernelMessageSender(ours, session, reader)
    try:
        waiting = asyncio.ensure_future(reader.batch())
        await asyncio.sleep(0.01)
        assert not waiting.done()  # nothing there yet: it waits on the signal
        # sent without a turn of the loop, then a send of ours before the loop sees it
        zmq.Socket.shadow(theirs.underlying).send_multipart(frames(kernel, content={"name": "stdout", "text": "x\n"}))
        sender.kernel_info()
        got = await asyncio.wait_for(waiting, 5)
        assert [m["content"]["text"] for m in got] == ["x\n"]
    finally:
        reader.close()


async def test_a_message_with_buffers_goes_out_as_jupyter_clients_session_sends_it(pipe: Pipe) -> None:
    """A Jupyter client's comm message may carry binary buffers (a widget's array)."""
    pull, push = pipe
    session = Session(key=KEY)
    msg = session.msg("comm_msg", {"comm_id": "c", "data": {}})
    msg["buffers"] = [b"\x00\x01", b"two"]
    KernelMessageSender(push, session).send(msg)
    ours = await asyncio.wait_for(pull.recv_multipart(), 5)
    session.send(push, msg)
    theirs = await asyncio.wait_for(pull.recv_multipart(), 5)
    assert ours == theirs
    receiver = Session(key=KEY)
    got = receiver.deserialize(receiver.feed_identities(ours)[1])
    assert got["msg_type"] == "comm_msg" and [bytes(b) for b in got["buffers"]] == [b"\x00\x01", b"two"]
