"""Executions per minute per API key: a token bucket per key, in memory.

A bucket holds up to ``rate`` tokens and refills ``rate`` per minute, so a key
may burst its whole minute at once and then runs at the steady rate. Refusals
say how long until the next token, which the API sends as ``Retry-After``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class _Bucket:
    rate: int
    tokens: float
    updated: float


class ExecutionRateLimiter:
    def __init__(self, clock: Callable[[], float] = time.monotonic, max_keys: int = 100_000) -> None:
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}
        self._max_keys = max_keys

    def acquire(self, key: str, per_minute: int) -> float:
        """Take one token: 0.0 when allowed, else the seconds until one is free."""
        now = self._clock()
        bucket = self._buckets.get(key)
        if bucket is None or bucket.rate != per_minute:
            if len(self._buckets) >= self._max_keys:
                self._buckets.clear()  # bounded memory; at worst a burst is forgiven
            bucket = self._buckets[key] = _Bucket(per_minute, float(per_minute), now)
        per_second = per_minute / 60.0
        bucket.tokens = min(float(per_minute), bucket.tokens + (now - bucket.updated) * per_second)
        bucket.updated = now
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return 0.0
        return (1.0 - bucket.tokens) / per_second
