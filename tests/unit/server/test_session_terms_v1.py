"""The /v1 face shows a session's metadata and lease as the E2B face sets them:
``metadata`` on create (bounded by the runtime, 400), both on every
``SessionInfo``, read-only, null lease when none runs. In-process, on kernel
subprocesses (a fork's copy of them: tests/integration/test_leases.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from kernelgw.errors import BadRequest
from kernelgw.runtime.lease import check_metadata
from kernelgw.runtime.manager import SessionOptions
from kernelgw.server.state import gateway_state
from tests.support.app import local_settings, serve
from tests.support.local_backend import LocalBackend


@pytest.fixture
async def gateway(local_backend: LocalBackend, tmp_path: Path) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    async with serve(local_settings(tmp_path), local_backend) as served:
        yield served


async def test_metadata_given_on_create_shows_on_every_answer_and_a_lease_when_one_runs(
    gateway: tuple[FastAPI, httpx.AsyncClient],
) -> None:
    app, http = gateway
    labels = {"project": "ünï", "run": "7"}
    created = await http.post("/v1/sessions", json={"metadata": labels})
    assert created.status_code == 201, created.text
    info: dict[str, Any] = created.json()
    assert info["metadata"] == labels and info["lease_until"] is None
    sid = info["id"]
    assert (await http.get(f"/v1/sessions/{sid}")).json()["metadata"] == labels
    listed = (await http.get("/v1/sessions")).json()["sessions"]
    assert [(s["id"], s["metadata"]) for s in listed] == [(sid, labels)]
    plain = (await http.post("/v1/sessions", json={})).json()
    assert plain["metadata"] == {} and plain["lease_until"] is None
    # a lease set below the face (as E2B's timeout does) shows here
    state = gateway_state(app)
    session = state.manager.get(sid)
    await state.manager.set_lease(session, 600)
    shown = (await http.get(f"/v1/sessions/{sid}")).json()["lease_until"]
    assert session.lease_until is not None and datetime.fromisoformat(shown) == session.lease_until


async def test_metadata_out_of_bounds_is_refused_with_what_to_change(
    gateway: tuple[FastAPI, httpx.AsyncClient], local_backend: LocalBackend
) -> None:
    _, http = gateway
    too_many = await http.post("/v1/sessions", json={"metadata": {str(i): "v" for i in range(65)}})
    assert too_many.status_code == 400 and "at most 64" in too_many.json()["error"]["message"]
    long_key = await http.post("/v1/sessions", json={"metadata": {"k" * 129: "v"}})
    assert long_key.status_code == 400 and "1 to 128 characters" in long_key.json()["error"]["message"]
    not_text = await http.post("/v1/sessions", json={"metadata": {"k": 1}})
    assert not_text.status_code == 422 and "metadata" in not_text.text
    assert local_backend.started == 0


async def test_the_faces_own_entries_are_neither_set_nor_shown_nor_counted_on_v1(
    gateway: tuple[FastAPI, httpx.AsyncClient], local_backend: LocalBackend
) -> None:
    """E2B's face keeps its template, token nonce and snapshot marks as ``kernelgw:``
    entries: a /v1 client may not set one, never sees one, and they do not use up
    the 64 labels a client has."""
    app, http = gateway
    refused = await http.post("/v1/sessions", json={"metadata": {"kernelgw:template": "x"}})
    assert refused.status_code == 422 and "kernelgw's own" in refused.text
    assert local_backend.started == 0
    state = gateway_state(app)
    full = {str(i): "v" for i in range(64)}
    own = {f"kernelgw:{n}": "kept" for n in ("template", "access-nonce", "snapshot-of", "snapshot-name")}
    session = await state.manager.create(SessionOptions(metadata={**full, **own}))
    assert session.metadata == {**full, **own}  # the face still reads its own
    for answer in (
        (await http.get(f"/v1/sessions/{session.id}")).json(),
        (await http.get("/v1/sessions")).json()["sessions"][0],
    ):
        assert answer["metadata"] == full
    with pytest.raises(BadRequest, match="at most 16"):
        check_metadata({f"kernelgw:{i}": "v" for i in range(17)})
