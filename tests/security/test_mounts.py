"""Threat: the kernel learns where the gateway keeps its data on the host
(mount sources in /proc/self/mountinfo), a map for any later escape. Under
gVisor every mount is the sandbox's own (9p or tmpfs, root ``/``): no host path
shows. Under runc the kernel sees Docker's own paths (overlay layers,
/var/lib/docker/containers/...) and the path of its connection directory under
``runtime_dir``, which runc reports and cannot hide; never the gateway's data
directory (history, keys, audit), which is not mounted at all."""

from __future__ import annotations

import httpx
import pytest

from tests.integration.conftest import RunningGateway
from tests.security.conftest import RUNTIME, run

pytestmark = pytest.mark.integration


def mountinfo(http: httpx.Client, session_id: str) -> list[list[str]]:
    result = run(http, session_id, "print(open('/proc/self/mountinfo').read(), end='')")
    text = "".join(e["text"] for e in result["events"] if e["type"] == "stream")
    rows = [line.split() for line in text.splitlines()]
    assert any(row[4] == "/conn" for row in rows), text  # the probe read the real table
    return rows


def test_no_gateway_directory_shows_in_the_mount_table(
    gateway: RunningGateway, http: httpx.Client, session_id: str
) -> None:
    rows = mountinfo(http, session_id)
    text = "\n".join(" ".join(row) for row in rows)
    data_dir = str(gateway.settings.data_dir)
    assert data_dir not in text
    if RUNTIME == "runsc":
        # every mount's root within its source is "/": nothing of the host's tree
        assert {row[3] for row in rows} == {"/"}, text
        assert str(gateway.settings.runtime_dir) not in text and "/var/lib/docker" not in text
    else:
        (conn,) = [row for row in rows if row[4] == "/conn"]
        # runc shows the bind mount's source path (relative to its file system):
        # the kernel's own connection directory, <runtime_dir>/<gateway name>/<kernel>
        assert f"/{gateway.settings.gateway_name}/" in conn[3], conn
