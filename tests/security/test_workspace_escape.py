"""Threat: the files API as a way out of the workspace: crafted names (traversal,
encodings, over-long), links the sandboxed code plants, and special files that
could wedge a transfer. No host file may ever be read or written, and nothing
outside /workspace in the container either.

Covered elsewhere (tests/integration/test_files.py): ``..``, ``/`` and NUL in
several encodings; links to /etc, /etc/passwd and / on GET/PUT/DELETE; a link
swapped in during an upload. Here: the other refusal rules (backslash, ``.``
and empty components, lengths), a host marker file, links through /proc,
recursive listings, FIFOs and sockets.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.security.conftest import assert_error, new_session, run, stdout

pytestmark = pytest.mark.integration


def files_url(sid: str, path: str = "") -> str:
    return f"/v1/sessions/{sid}/files/{path}" if path else f"/v1/sessions/{sid}/files"


def workspace_tree(http: httpx.Client, sid: str) -> list[list[object]]:
    code = (
        "import os, json\n"
        "print(json.dumps(sorted([os.path.relpath(os.path.join(d, n), '/workspace'), "
        "os.lstat(os.path.join(d, n)).st_size] for d, ds, fs in os.walk('/workspace') for n in ds + fs)))"
    )
    return json.loads(stdout(run(http, sid, code)))  # type: ignore[no-any-return]


def error_code(resp: httpx.Response) -> str | None:
    """The gateway's error code, or None for an answer that is not an error."""
    try:
        return resp.json()["error"]["code"]  # type: ignore[no-any-return]
    except (ValueError, KeyError, TypeError):
        return None


@pytest.fixture(scope="module")
def workspace(http: httpx.Client) -> Iterator[str]:
    """A session whose workspace holds a little, for the traversal attempts."""
    with new_session(http) as sid:
        assert http.put(files_url(sid, "sub/keep.txt"), content=b"keep").status_code == 201
        assert http.put(files_url(sid, "a/b"), content=b"b").status_code == 201
        yield sid


def _marker_relative(marker: Path) -> str:
    return "%2E%2E/" * 8 + str(marker).lstrip("/")


TRAVERSALS = {
    "backslashes": lambda m: "..\\..\\etc\\passwd",
    "dot-component": lambda m: "a/%2E/b",
    "leading-dot": lambda m: "%2E/sub/keep.txt",
    "empty-component": lambda m: "sub//keep.txt",
    "trailing-dot-dot": lambda m: "sub/%2E%2E",
    "host-marker-relative": _marker_relative,
    "host-marker-absolute": lambda m: "%2F" + str(m).lstrip("/").replace("/", "%2F"),
    "long-component": lambda m: "a" * 256,
    "long-path": lambda m: "a/" * 2100 + "x",
}


@pytest.mark.parametrize("kind", list(TRAVERSALS))
def test_crafted_names_are_refused_everywhere(http: httpx.Client, workspace: str, host_marker: Path, kind: str) -> None:
    path = TRAVERSALS[kind](host_marker)
    host_content = host_marker.read_bytes()
    before = workspace_tree(http, workspace)
    for method in ("GET", "PUT", "DELETE"):
        resp = http.request(method, files_url(workspace, path), content=b"kgw-evil")
        error = assert_error(resp, 400)
        assert error["code"] == "invalid_path", (method, error)
        assert host_content not in resp.content
    decoded = httpx.URL("http://x/" + path).path[1:]  # the listing takes it as a query parameter
    assert_error(http.get(files_url(workspace), params={"path": decoded}), 400)
    assert host_marker.read_bytes() == host_content  # neither read nor written
    assert workspace_tree(http, workspace) == before


def test_links_out_of_the_workspace_serve_nothing(http: httpx.Client, session_id: str, host_marker: Path) -> None:
    code = (
        "import os\n"
        f"os.symlink({str(host_marker)!r}, 'marker')\n"  # dangling here: the path is the host's
        "os.symlink('/proc/1/root', 'init_root')\n"
        "os.symlink('/proc/self/cwd/..', 'up')\n"
        "os.symlink('/etc/hostname', 'hostname')\n"
        "os.makedirs('deep/er')\n"
        "os.symlink('/proc/self/root/etc', 'deep/er/etc')\n"
        "os.symlink('/tmp', 'tmp')\n"
        "try:\n"
        "    os.link('/etc/passwd', 'hard')\n"  # across file systems: refused by the kernel
        "except OSError as e:\n"
        "    print('no hard link', e.errno)\n"
    )
    assert run(http, session_id, code)["status"] == "ok"
    before = workspace_tree(http, session_id)
    host_hostname = Path("/etc/hostname").read_bytes().strip() or b"\0"
    secrets = [host_marker.read_bytes(), b"root:x:0:0", host_hostname]
    outcomes: dict[str, object] = {}
    leaked: list[str] = []
    for method, path in [
        ("GET", "marker"),
        ("GET", "hostname"),
        ("GET", "init_root/etc/passwd"),
        ("GET", "up/etc/passwd"),
        ("GET", "up/workspace/hostname"),
        ("GET", "deep/er/etc/passwd"),
        ("GET", "tmp/.ipython/profile_default"),
        ("PUT", "tmp/kgw-evil"),
        ("PUT", "up/tmp/kgw-evil"),
        ("PUT", "init_root/tmp/kgw-evil"),
        ("DELETE", "deep/er/etc/hostname"),
        ("DELETE", "tmp/.ipython"),
    ]:
        resp = http.request(method, files_url(session_id, path), content=b"kgw-evil")
        outcomes[f"{method} {path}"] = (resp.status_code, error_code(resp))
        if any(s in resp.content for s in secrets):
            leaked.append(path)
    for path in ["up", "init_root", "deep/er/etc", "tmp"]:
        resp = http.get(files_url(session_id), params={"path": path})
        outcomes[f"LIST {path}"] = (resp.status_code, error_code(resp))
    wrong = {k: v for k, v in outcomes.items() if v != (400, "invalid_path")}
    assert not wrong, "not refused as invalid_path: " + "; ".join(f"{k} -> {v}" for k, v in wrong.items())
    assert leaked == []
    assert http.get(files_url(session_id, "hard")).status_code == 404
    after = "print(os.path.exists('/tmp/kgw-evil'), os.path.exists('/tmp/.ipython'), open('/etc/hostname').read())"
    assert stdout(run(http, session_id, "import os\n" + after)) == "False True sandbox\n\n"
    assert workspace_tree(http, session_id) == before


def test_recursive_listing_never_follows_links(http: httpx.Client, session_id: str) -> None:
    code = (
        "import os\n"
        "os.makedirs('d/e')\n"
        "open('d/e/f.txt', 'w').write('f')\n"
        "os.symlink('/', 'd/root')\n"
        "os.symlink('..', 'd/e/loop')\n"
    )
    assert run(http, session_id, code)["status"] == "ok"
    resp = http.get(files_url(session_id), params={"recursive": "true"})
    assert resp.status_code == 200, resp.text
    entries = {e["path"]: e["type"] for e in resp.json()["entries"]}
    assert entries == {
        "d": "directory",
        "d/e": "directory",
        "d/e/f.txt": "file",
        "d/root": "symlink",
        "d/e/loop": "symlink",
    }


def test_special_files_are_refused_at_once(http: httpx.Client, session_id: str) -> None:
    # a FIFO would block a reader forever; a socket has no bytes at all
    code = "import os, socket\nos.mkfifo('pipe')\ns = socket.socket(socket.AF_UNIX)\ns.bind('/workspace/sock')\n"
    assert run(http, session_id, code)["status"] == "ok"
    for path in ("pipe", "sock"):
        for method in ("GET", "PUT"):
            resp = http.request(method, files_url(session_id, path), content=b"x", timeout=15)
            assert assert_error(resp, 400)["code"] == "invalid_path", (method, path)
    assert run(http, session_id, "import os\nprint(os.path.exists('pipe'), os.path.exists('sock'))")["status"] == "ok"
    assert http.delete(files_url(session_id, "pipe")).status_code == 204
    assert http.put(files_url(session_id, "pipe"), content=b"now a file").status_code == 201
    assert http.get(files_url(session_id, "pipe")).content == b"now a file"
