"""Threat: a session that makes the gateway write its own disk full through a
pause or a fork. A file may claim any size (``truncate`` makes a 2 GiB file in
a 32 MiB workspace); the gateway's snapshot of a session must stay within what
the session's tmpfs sizes hold, and a copy must never need more room than the
files really take.

Covered elsewhere (tests/integration/test_pause.py): a tree whose tar stream
passes the cap (many empty files) is a 413, the gateway's budget for paused
sessions a 507, a snapshot that does not fit a resume a 413 that keeps the
session paused, and the expiry of paused sessions.

Under gVisor (runsc) a file's holes cannot be seen: ``st_blocks`` counts its
whole size and ``lseek(SEEK_DATA/SEEK_HOLE)`` fails with EINVAL, so GNU tar's
``--sparse`` sends every zero. There the same pause and fork are refused (413)
once the stream passes the cap, and the session runs on: bounded, not sparse.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import RUNTIME, RunningGateway
from tests.security.conftest import MiB, assert_error, new_session, run_json

pytestmark = pytest.mark.integration

SPARSE = """\
for where in ('/workspace/huge.bin', '/opt/kernelgw/packages/huge.bin'):
    with open(where, 'wb') as f:
        f.truncate(2 << 30)
        f.seek(1 << 30)
        f.write(b'middle')
st = os.stat('/workspace/huge.bin')
print(json.dumps({'size': st.st_size, 'holes_seen': st.st_blocks * 512 < st.st_size}))
"""
CHECK = """\
st = os.stat('/workspace/huge.bin')
with open('/workspace/huge.bin', 'rb') as f:
    f.seek(1 << 30)
    middle = f.read(6).decode()
print(json.dumps({'size': st.st_size, 'allocated': st.st_blocks * 512, 'middle': middle,
                  'packages': os.path.getsize('/opt/kernelgw/packages/huge.bin')}))
"""


def test_sparse_files_claiming_gigabytes_make_a_small_snapshot_and_a_fork(
    http: httpx.Client, gateway: RunningGateway
) -> None:
    with new_session(http) as sid:
        made = run_json(http, sid, SPARSE)
        assert made == {"size": 2 << 30, "holes_seen": RUNTIME != "runsc"}, made
        snapshot = Path(gateway.settings.data_dir) / "paused" / sid
        resp = http.post(f"/v1/sessions/{sid}/pause")
        if RUNTIME == "runsc":
            refused_cleanly(http, gateway, sid, resp)
            return
        assert resp.status_code == 200, resp.text
        on_disk = sum(f.stat().st_size for f in snapshot.iterdir())
        # what the files hold (a few pages), not what they claim; far under the cap
        assert resp.json()["stored_bytes"] == on_disk < 2 * MiB, on_disk
        caps = (gateway.settings.workspace_size_mb + gateway.settings.packages_size_mb) * MiB
        assert on_disk < caps

        # resumed sparse: the same claim and data, and the workspace still has room
        assert http.post(f"/v1/sessions/{sid}/resume").status_code == 200, resp.text
        restored = run_json(http, sid, CHECK)
        assert restored["size"] == restored["packages"] == 2 << 30 and restored["middle"] == "middle"
        assert restored["allocated"] < 1 * MiB, restored

        # a fork copies the same few pages into a workspace of the same size
        resp = http.post("/v1/sessions", json={"from": sid})
        assert resp.status_code == 201, resp.text
        child = resp.json()["id"]
        try:
            assert resp.json()["fork"]["copied_bytes"] < 2 * MiB
            forked = run_json(http, child, CHECK)
            assert forked["size"] == 2 << 30 and forked["middle"] == "middle" and forked["allocated"] < 1 * MiB
        finally:
            http.delete(f"/v1/sessions/{child}")


def refused_cleanly(http: httpx.Client, gateway: RunningGateway, sid: str, resp: httpx.Response) -> None:
    """gVisor: the pause and the fork stop at the cap, keep nothing, and the session runs on."""
    error = assert_error(resp, 413)
    assert error["code"] == "snapshot_too_large" and "goes on running" in error["message"], error
    assert not (Path(gateway.settings.data_dir) / "paused" / sid).exists()
    before = len(http.get("/v1/sessions").json()["sessions"])
    fork = http.post("/v1/sessions", json={"from": sid})
    assert assert_error(fork, 413)["code"] == "copy_too_large", fork.text
    assert len(http.get("/v1/sessions").json()["sessions"]) == before
    assert http.get(f"/v1/sessions/{sid}").json()["state"] == "idle"
    kept = run_json(http, sid, CHECK)
    assert kept["size"] == 2 << 30 and kept["middle"] == "middle", kept
