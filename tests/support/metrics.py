"""Reading a running gateway's Prometheus metrics in tests."""

from __future__ import annotations

import re

import httpx


def metric(http: httpx.Client, name: str, labels: str = "", *, absent: float | None = None) -> float:
    """A sample's value. The metric must be declared, and the sample present:
    only a "before" reading of a labelled counter, which has no sample until
    its first increment, may pass ``absent=0`` to stand for it."""
    resp = http.get("/metrics")
    assert resp.status_code == 200, resp.text
    family = re.sub(r"_(total|count|sum|bucket|created)$", "", name)
    declared = rf"^# TYPE ({re.escape(name)}|{re.escape(family)}) "
    assert re.search(declared, resp.text, re.MULTILINE), f"no metric {name} at all"
    match = re.search(rf"^{re.escape(name)}{re.escape(labels)} ([0-9.e+-]+)$", resp.text, re.MULTILINE)
    if match is None:
        assert absent is not None, f"no sample {name}{labels} in /metrics"
        return absent
    return float(match.group(1))
