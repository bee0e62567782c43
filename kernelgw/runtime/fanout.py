"""Event fan-out: numbering, the replay buffer, and one bounded queue per subscriber.

Every event is numbered with a per-session ``seq``, serialised once, kept in a
replay buffer bounded by count and by bytes, and handed to every subscriber's
bounded queue. A subscriber that falls too far behind is dropped (it can resume
from its last ``seq``); it never slows the kernel or the other subscribers.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from kernelgw import events as ev
from kernelgw.runtime.session_config import SessionConfig


@dataclass(frozen=True)
class Published:
    """An event as sent: its number, its JSON text (made once), and the model
    of the events read again later (`KEPT_MODELS`); an output's model is let
    go once serialised, or a cell's output would be held twice until it ends."""

    seq: int
    event: ev.Event | None
    json: str


KEPT_MODELS = (ev.Done, ev.Error)
"""Events whose model outlives publishing: a cell's end and its error (the
audit record and the history's summary read them)."""


_UNNUMBERED = '{"seq":null'


def numbered_json(event: ev.Event, seq: int) -> str:
    """``event`` (not numbered yet) as JSON numbered ``seq``: the very text of
    ``event.model_copy(update={"seq": seq}).model_dump_json()`` (``seq`` is every
    event's first field), without copying the model for an event whose model is
    let go (a few us an event)."""
    text = event.model_dump_json()
    if not text.startswith(_UNNUMBERED):
        return event.model_copy(update={"seq": seq}).model_dump_json()
    return f'{{"seq":{seq}{text[len(_UNNUMBERED) :]}'


class Subscription:
    """A bounded queue of JSON texts for one WebSocket client.

    Bounded by count and by bytes: a client that does not keep up is dropped
    (``overflowed``) instead of letting the gateway's memory grow.
    """

    def __init__(self, maxsize: int, max_bytes: int = 64 * 1024 * 1024) -> None:
        self.queue: asyncio.Queue[str | None] = asyncio.Queue()
        self.maxsize = maxsize
        self.max_bytes = max_bytes
        self.queued_bytes = 0
        self.overflowed = False
        self.closed = False

    def offer(self, text: str) -> None:
        if self.closed:
            return
        if self.queue.qsize() >= self.maxsize or self.queued_bytes + len(text) > self.max_bytes:
            self.overflowed = True
            self.close()
            return
        self.queued_bytes += len(text)
        self.queue.put_nowait(text)

    async def get(self) -> str | None:
        """The next text, or None once the subscription is closed."""
        if self.closed and self.overflowed:
            return None  # dropped: what is still queued is not worth sending
        text = await self.queue.get()
        if text is not None:
            self.queued_bytes -= len(text)
        return text

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.queue.put_nowait(None)


SEQ_BLOCK = 10_000
"""How far ahead of the last published ``seq`` the store is told to continue
after a crash. A gateway killed with -9 cannot store the numbers it used last;
its successor starts past the reservation instead, so a resuming client never
takes a new event for one it already has (it gets a ``gap`` for the hole)."""


class EventFanout:
    """One session's event stream: what was published, and who is listening."""

    def __init__(self, config: SessionConfig) -> None:
        self.config = config
        self.seq = 0
        self.reserved = SEQ_BLOCK
        """Numbers up to this may have been used: where a successor continues.
        Renewed (`on_reserve`) half a block before it runs out."""
        self.on_reserve: Callable[[], None] | None = None
        # (seq, json) only: the event models are not kept for replay, and the
        # buffer is bounded by count and by bytes (large outputs age out fast).
        self.replay: collections.deque[tuple[int, str]] = collections.deque()
        self.replay_bytes = 0
        self._subscribers: set[Subscription] = set()

    def publish(self, event: ev.Event, prepared: Published | None = None) -> Published:
        """Number ``event`` and send it; ``prepared``: the same event already
        numbered and serialised as the next one (a cell's ``done``, stored before
        it is sent), sent as it is rather than copied and serialised again."""
        self.seq += 1
        if self.seq > self.reserved - SEQ_BLOCK // 2:
            self.reserved = self.seq + SEQ_BLOCK
            if self.on_reserve is not None:
                self.on_reserve()
        if prepared is not None and prepared.seq == self.seq and prepared.event is not None:
            pub = prepared
        elif event.seq is None and not isinstance(event, KEPT_MODELS):
            pub = Published(self.seq, None, numbered_json(event, self.seq))
        else:
            event = event.model_copy(update={"seq": self.seq})
            pub = Published(self.seq, event if isinstance(event, KEPT_MODELS) else None, event.model_dump_json())
        self.replay.append((pub.seq, pub.json))
        self.replay_bytes += len(pub.json)
        self._trim()
        for sub in list(self._subscribers):
            sub.offer(pub.json)
            if sub.closed:
                self._subscribers.discard(sub)
        return pub

    def seed(self, events: Iterable[tuple[int, str]], seq: int) -> None:
        """Continue a stream a previous gateway process published: ``events``
        (``seq``, JSON text; oldest first) from the store refill the replay
        buffer, and numbering goes on after ``seq`` (its reservation), so what
        it sent and never stored shows up as a gap to a resuming client."""
        for number, text in events:
            if number <= self.seq:
                continue
            self.seq = number
            self.replay.append((number, text))
            self.replay_bytes += len(text)
        self._trim()
        self.seq = max(self.seq, seq)
        # a fresh reservation at once: the stored one may be the exact last
        # number of a clean stop, and this process may be killed next
        self.reserved = self.seq + SEQ_BLOCK
        if self.on_reserve is not None:
            self.on_reserve()

    def _trim(self) -> None:
        while self.replay and (
            len(self.replay) > self.config.replay_buffer or self.replay_bytes > self.config.replay_buffer_bytes
        ):
            self.replay_bytes -= len(self.replay.popleft()[1])

    def subscribe(self, last_seq: int | None = None, *, closed: bool = False) -> Subscription:
        """A live subscription; with ``last_seq``, first the events after it,
        and a ``gap`` for every range of numbers the replay cannot give.
        ``closed``: replay only (the session is going away).

        Replay and registration happen without an await in between, so no event
        is missed or delivered twice.
        """
        sub = Subscription(self.config.subscriber_queue, self.config.subscriber_max_bytes)
        if last_seq is not None and last_seq < self.seq:
            expected = last_seq + 1
            for seq, text in self.replay:
                if seq < expected:
                    continue
                if seq > expected:
                    sub.offer(ev.Gap(first_missing=expected, last_missing=seq - 1).model_dump_json())
                sub.offer(text)
                expected = seq + 1
            if expected <= self.seq:
                sub.offer(ev.Gap(first_missing=expected, last_missing=self.seq).model_dump_json())
        if closed:
            sub.close()
        else:
            self._subscribers.add(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        self._subscribers.discard(sub)
        sub.close()

    def close_all(self) -> None:
        for sub in list(self._subscribers):
            sub.close()
        self._subscribers.clear()

    @property
    def subscriber_count(self) -> int:
        return len(self._subscribers)
