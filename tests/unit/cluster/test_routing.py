"""Which paths name a session, and which need its owner."""

from __future__ import annotations

import pytest

from kernelgw.cluster.routing import create_face, create_source_field, session_route

SID = "3f2b9c1e-0d4a-4e5b-8c6d-7e8f9a0b1c2d"


@pytest.mark.parametrize(
    ("path", "face", "rest"),
    [
        (f"/v1/sessions/{SID}", "v1", ""),
        (f"/v1/sessions/{SID}/execute", "v1", "/execute"),
        (f"/v1/sessions/{SID}/ws", "v1", "/ws"),
        (f"/v1/sessions/{SID}/files/a/b.txt", "v1", "/files/a/b.txt"),
        (f"/api/kernels/{SID}", "jupyter", ""),
        (f"/api/kernels/{SID}/channels", "jupyter", "/channels"),
    ],
)
def test_session_paths_name_their_session(path: str, face: str, rest: str) -> None:
    route = session_route(path)
    assert route is not None and (route.session_id, route.face, route.rest) == (SID, face, rest)


@pytest.mark.parametrize("path", ["/v1/sessions", "/v1/sessions/", "/api/kernels", "/api/kernelspecs/x", "/healthz"])
def test_other_paths_name_none(path: str) -> None:
    assert session_route(path) is None


def test_history_and_notebooks_are_read_from_the_store_anywhere_but_notes_need_the_owner() -> None:
    history = session_route(f"/v1/sessions/{SID}/history")
    notebook = session_route(f"/v1/sessions/{SID}/notebook")
    notes = session_route(f"/v1/sessions/{SID}/notes")
    assert history is not None and history.from_store("GET")
    assert notebook is not None and notebook.from_store("GET")
    assert notes is not None and not notes.from_store("POST")


def test_a_dashed_jupyter_id_also_finds_a_compact_stored_id() -> None:
    route = session_route("/api/kernels/" + "0123456789abcdef0123456789abcdef"[:8] + "-0123-4567-89ab-cdef01234567")
    assert route is not None
    assert route.candidate_ids()[1] == "012345670123456789abcdef01234567"
    plain = session_route("/v1/sessions/not-hex")
    assert plain is not None and plain.candidate_ids() == ["not-hex"]


def test_creates_are_posts_to_the_collections() -> None:
    assert create_face("POST", "/v1/sessions") == "v1"
    assert create_face("POST", "/api/kernels") == "jupyter"
    assert create_face("GET", "/v1/sessions") is None
    assert create_face("POST", f"/v1/sessions/{SID}/execute") is None


@pytest.mark.parametrize(
    ("path", "rest"),
    [
        (f"/e2b/sandboxes/{SID}", ""),
        (f"/e2b/sandboxes/{SID}/pause", "/pause"),
        (f"/e2b/v2/sandboxes/{SID}/connect", "/connect"),
        (f"/e2b/sandboxes/{SID}/snapshots", "/snapshots"),
        (f"/e2b/templates/{SID}", ""),  # a snapshot's delete
    ],
)
def test_e2b_control_paths_name_their_sandbox_whatever_the_headers(path: str, rest: str) -> None:
    for headers in (None, {"e2b-sandbox-id": "another"}):
        route = session_route(path, headers)
        assert route is not None and (route.session_id, route.face, route.rest) == (SID, "e2b", rest)
        assert not route.sandbox_traffic and not route.from_store("GET")


@pytest.mark.parametrize("path", ["/e2b/execute", "/e2b/contexts", "/e2b/contexts/c1/restart", "/e2b/files"])
def test_e2b_sandbox_traffic_names_its_sandbox_in_a_header(path: str) -> None:
    route = session_route(path, {"e2b-sandbox-id": SID})
    assert route is not None and (route.session_id, route.face, route.rest) == (SID, "e2b", path)
    assert route.sandbox_traffic
    assert session_route(path) is None  # no header: no sandbox (the face answers it)
    assert session_route(path, {"e2b-sandbox-id": "  "}) is None


@pytest.mark.parametrize(
    "path", ["/e2b/sandboxes", "/e2b/v2/sandboxes", "/e2b/sandboxes/metrics", "/e2b/snapshots", "/e2b/templates"]
)
def test_e2b_listings_and_the_key_wide_routes_name_no_sandbox(path: str) -> None:
    assert session_route(path, {"e2b-sandbox-id": SID}) is None


def test_e2b_creates_are_placed_and_may_come_from_a_snapshot() -> None:
    assert create_face("POST", "/e2b/sandboxes") == "e2b"
    assert create_face("POST", "/e2b/v2/sandboxes/") == "e2b"
    assert create_face("GET", "/e2b/v2/sandboxes") is None
    assert create_source_field("e2b") == "templateID"
    assert create_source_field("v1") == "from"
    assert create_source_field("jupyter") is None
