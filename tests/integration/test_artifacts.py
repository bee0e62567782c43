"""Artifacts: the files a cell created or changed in the workspace arrive in its
``done`` event (REST and WebSocket), typed, and download byte-identical."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import httpx
import pytest
from websockets.sync.client import connect

from tests.integration.conftest import RunningGateway, run, stdout

pytestmark = pytest.mark.integration

XLSX = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"


def done(result: dict[str, Any]) -> dict[str, Any]:
    (event,) = [e for e in result["events"] if e["type"] == "done"]
    return event


def artifacts(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {a["path"]: a for a in done(result)["artifacts"]}


def test_excel_and_png_written_by_a_cell_are_artifacts_and_download_identical(
    http: httpx.Client, session_id: str
) -> None:
    code = """\
import hashlib, json
import pandas as pd
import matplotlib
import matplotlib.pyplot as plt
df = pd.DataFrame({"x": range(10), "y": [v * v for v in range(10)]})
df.to_excel("out.xlsx", index=False)
fig, ax = plt.subplots()
ax.plot(df.x, df.y)
fig.savefig("plot.png")
plt.close(fig)
print(json.dumps({p: hashlib.sha256(open(p, "rb").read()).hexdigest() for p in ["out.xlsx", "plot.png"]}))
"""
    result = run(http, session_id, code)
    assert result["status"] == "ok", result
    hashes = json.loads(stdout(result))
    found = artifacts(result)
    assert set(found) == {"out.xlsx", "plot.png"}
    assert found["out.xlsx"]["mime_type"] == XLSX and found["plot.png"]["mime_type"] == "image/png"
    assert all(a["change"] == "created" for a in found.values())
    for path, artifact in found.items():
        resp = http.get(f"/v1/sessions/{session_id}/files/{path}")
        assert resp.status_code == 200
        assert resp.headers["content-type"] == artifact["mime_type"]
        assert len(resp.content) == artifact["size"]
        assert hashlib.sha256(resp.content).hexdigest() == hashes[path]
    assert resp.content.startswith(b"\x89PNG\r\n\x1a\n")


def test_uploaded_files_are_not_artifacts_until_a_cell_changes_them(http: httpx.Client, session_id: str) -> None:
    assert http.put(f"/v1/sessions/{session_id}/files/data.csv", content=b"x\n1\n").status_code == 201
    result = run(http, session_id, "import pandas as pd\ndf = pd.read_csv('data.csv')\nlen(df)")
    assert done(result)["artifacts"] == []
    result = run(http, session_id, "df.assign(y=df.x * 2).to_csv('data.csv', index=False)")
    assert artifacts(result) == {
        "data.csv": {"path": "data.csv", "size": 8, "mime_type": "text/csv", "change": "modified"}
    }
    # unchanged in the next cell: not reported again
    assert done(run(http, session_id, "1 + 1"))["artifacts"] == []


def test_nested_files_and_what_is_left_out(http: httpx.Client, session_id: str) -> None:
    code = """\
import os
os.makedirs("reports/2024", exist_ok=True)
open("reports/2024/summary.md", "w").write("# hi")
os.makedirs("__pycache__", exist_ok=True)
open("__pycache__/mod.cpython-311.pyc", "wb").write(b"c")
os.symlink("/etc/passwd", "passwd-link")
os.makedirs("empty-dir")
"""
    result = run(http, session_id, code)
    assert artifacts(result) == {
        "reports/2024/summary.md": {
            "path": "reports/2024/summary.md",
            "size": 4,
            "mime_type": "text/markdown",
            "change": "created",
        }
    }


def test_files_written_before_an_exception_are_still_reported(http: httpx.Client, session_id: str) -> None:
    result = run(http, session_id, "open('partial.json', 'w').write('{}')\nraise ValueError('boom')")
    assert result["status"] == "error"
    assert list(artifacts(result)) == ["partial.json"]
    assert artifacts(result)["partial.json"]["mime_type"] == "application/json"


def test_websocket_done_event_carries_the_artifacts(gateway: RunningGateway, session_id: str) -> None:
    with connect(f"{gateway.ws_url}/v1/sessions/{session_id}/ws") as ws:
        ws.send(json.dumps({"type": "execute", "code": "open('ws.txt', 'w').write('hi')", "execution_id": "c1"}))
        while True:
            event = json.loads(ws.recv())
            if event["type"] == "done":
                break
    assert event["artifacts"] == [{"path": "ws.txt", "size": 2, "mime_type": "text/plain", "change": "created"}]


def test_sdk_execution_exposes_done_artifacts(gateway_url: str) -> None:
    from kernelgw.client import Client

    with Client(gateway_url) as client, client.session() as session:
        execution = session.run("open('a.csv', 'w').write('a\\n1\\n')")
        (event,) = [e for e in execution.events if e.type == "done"]
        assert [(a.path, a.mime_type, a.change) for a in event.artifacts] == [("a.csv", "text/csv", "created")]
        assert session.download(event.artifacts[0].path) == b"a\n1\n"
