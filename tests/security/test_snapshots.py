"""Threat: a session that makes the gateway write its own disk full through a
pause or a fork. A file may claim any size (``truncate`` makes a 2 GiB file in
a 32 MiB workspace); the gateway's snapshot of a session must stay within what
the session's tmpfs sizes hold, and a copy must never need more room than the
files really take.

Covered elsewhere (tests/integration/test_pause.py): a tree whose tar stream
passes the cap (many empty files) is a 413, the gateway's budget for paused
sessions a 507, a snapshot that does not fit a resume a 413 that keeps the
session paused, and the expiry of paused sessions.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import RunningGateway
from tests.security.conftest import MiB, new_session, run_json

pytestmark = pytest.mark.integration

SPARSE = """\
for where in ('/workspace/huge.bin', '/opt/kernelgw/packages/huge.bin'):
    with open(where, 'wb') as f:
        f.truncate(2 << 30)
        f.seek(1 << 30)
        f.write(b'middle')
print(json.dumps({'size': os.path.getsize('/workspace/huge.bin')}))
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
        assert run_json(http, sid, SPARSE) == {"size": 2 << 30}
        resp = http.post(f"/v1/sessions/{sid}/pause")
        assert resp.status_code == 200, resp.text
        snapshot = Path(gateway.settings.data_dir) / "paused" / sid
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
