"""OomCounter: the engine's ``oom`` events counted per container (a fake event stream)."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

from kernelgw.runtime.backends import oom_events
from kernelgw.runtime.backends.oom_events import OomCounter


class FakeStream:
    """Yields what the test puts in; ends (a broken stream) on ``None``."""

    def __init__(self) -> None:
        self.events: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.closed = threading.Event()

    def __iter__(self) -> Iterator[dict[str, Any]]:
        while (event := self.events.get()) is not None:
            yield event

    def close(self) -> None:
        self.closed.set()
        self.events.put(None)


class FakeClient:
    def __init__(self) -> None:
        self.streams: list[FakeStream] = []
        self.filters: list[dict[str, Any]] = []

    def events(self, *, decode: bool, filters: dict[str, Any]) -> FakeStream:
        self.filters.append(filters)
        self.streams.append(FakeStream())
        return self.streams[-1]


def wait_until(check: Any) -> None:
    deadline = time.monotonic() + 10
    while not check():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_counts_each_containers_oom_events_and_survives_a_broken_stream(monkeypatch: Any) -> None:
    monkeypatch.setattr(oom_events, "RESUBSCRIBE_S", 0.01)
    client = FakeClient()
    counter = OomCounter("gw", lambda: client)  # type: ignore[arg-type, return-value]
    assert not counter.watching
    counter.ensure_watching()
    counter.ensure_watching()  # once
    assert len(client.streams) == 1 and counter.watching
    assert client.filters[0] == {"type": ["container"], "event": ["oom"], "label": ["kernelgw.gateway=gw"]}
    first = client.streams[0]
    first.events.put({"id": "a", "Action": "oom"})
    first.events.put({"id": "a", "Action": "oom"})
    first.events.put({"id": "b", "Action": "oom"})
    first.events.put({"id": "a", "Action": "die"})
    wait_until(lambda: counter.count("b") == 1)
    assert counter.count("a") == 2 and counter.count("c") == 0
    first.events.put(None)  # the engine went away: subscribed again, counts kept
    wait_until(lambda: len(client.streams) == 2 and counter.watching)
    client.streams[1].events.put({"id": "a", "Action": "oom"})
    wait_until(lambda: counter.count("a") == 3)
    counter.forget("a")
    assert counter.count("a") == 0
    counter.close()
    assert client.streams[1].closed.is_set() and not counter.watching
