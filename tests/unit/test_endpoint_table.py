"""The endpoint table of docs/reference/rest-api.md against the app's routes, both ways: every
documented route exists, and every API route is documented."""

from __future__ import annotations

import re
from pathlib import Path

from kernelgw.server import create_app
from tests.support.routes import endpoints

PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "rest-api.md"
UNDOCUMENTED = {"/", "/favicon.ico", "/static/{}", "/openapi.json", "/docs", "/redoc"}
"""The web page and FastAPI's own docs pages: not API endpoints (the table points to /docs)."""


def _shape(path: str) -> str:
    """``/v1/sessions/{id}/files?path=`` and ``/v1/sessions/{session_id}/files`` alike: ``/v1/sessions/{}/files``."""
    return re.sub(r"\{[^}]*\}", "{}", path.split("?", 1)[0])


def documented() -> set[tuple[str, str]]:
    """(method, path shape) of every row of the table headed "method and path"."""
    lines = PAGE.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| method and path |"))
    rows = []
    for line in lines[start + 1 :]:
        if rows and not line.startswith("|"):
            break
        if line.startswith("| `"):
            rows.append(line.split("|")[1])
    found = set()
    for cell in rows:
        for method, path in re.findall(r"`(GET|POST|PUT|DELETE|PATCH|WS) (/[^`\s]*)`", cell):
            found.add((method, _shape(path)))
    return found


def test_the_table_is_found_and_parsed() -> None:
    table = documented()
    assert ("POST", "/v1/sessions") in table and ("WS", "/v1/sessions/{}/ws") in table
    assert len(table) >= 15


def test_every_documented_endpoint_exists() -> None:
    served = {(e.method, _shape(e.path)) for e in endpoints(create_app())}
    missing = sorted(documented() - served)
    assert not missing, f"docs/reference/rest-api.md documents endpoints the app does not serve: {missing}"


def test_every_api_endpoint_is_documented() -> None:
    served = {(e.method, _shape(e.path)) for e in endpoints(create_app()) if _shape(e.path) not in UNDOCUMENTED}
    missing = sorted(served - documented())
    assert not missing, f"add these to the endpoint table in docs/reference/rest-api.md: {missing}"
