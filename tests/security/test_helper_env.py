"""Threat: a session that turns the gateway's own helpers against it. The gateway
runs programs in a kernel's container (``tar`` for pause, resume and fork; the
Python file helper for the files API); a session owns that container's
environment (``env`` at create) and every writable directory in it. Whatever it
does, the helpers run the image's programs in a fixed environment: a kernel's
``tar``, ``python3`` or ``sh`` never runs, and a pause stores the workspace's
real bytes (a hostile ``tar`` once fed a 600 MB snapshot of an empty workspace
to the gateway).

Variables that choose which program runs or what the loader injects (PATH,
LD_*) are refused at every face, with a status and a message naming the
variable; NUL, bad names and over-long values likewise.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from kernelgw.runtime.workspace import FS_HELPER, PYTHON, TAR, WorkspaceFiles, read_tree
from tests.integration.languages import image_for, start_kernel
from tests.security.conftest import PROBE, MiB, assert_error, new_session, run_json

pytestmark = pytest.mark.integration

HOSTILE_BYTES = 20 * MiB
"""What each planted program writes to its stdout: a helper that ran one would
hand the gateway this much."""

ALLOWED_HOSTILE_ENV = {
    # tar reads its options from here: a compressor is a program tar runs
    "TAR_OPTIONS": "--use-compress-program=/tmp/bin/evil",
    # a Python started without -I would import sitecustomize from here
    "PYTHONPATH": "/tmp/bin",
    "PYTHONSTARTUP": "/tmp/bin/startup.py",
}
"""Variables a session may set (its kernel's own business): they must reach no helper."""

PLANT = f"""\
import os, stat, sys
os.makedirs('/tmp/bin', exist_ok=True)
script = '#!/bin/sh\\n: > /workspace/pwned-$(basename "$0")\\nhead -c {HOSTILE_BYTES} /dev/zero\\n'
for d in ('/tmp/bin', '/workspace'):
    for name in ('tar', 'python', 'python3', 'sh', 'env', 'evil'):
        p = os.path.join(d, name)
        with open(p, 'w') as f:
            f.write(script)
        os.chmod(p, 0o755)
planted = "open('/workspace/pwned-python-' + __name__, 'w').close()\\n"
for name in ('sitecustomize.py', 'usercustomize.py', 'startup.py'):
    with open('/tmp/bin/' + name, 'w') as f:
        f.write(planted)
site = os.path.expanduser('~/.local/lib/python%d.%d/site-packages' % sys.version_info[:2])
os.makedirs(site, exist_ok=True)
with open(os.path.join(site, 'evil.pth'), 'w') as f:
    f.write("import os; open('/workspace/pwned-pth', 'w').close()\\n")
# the kernel's own environment, which its own children inherit
os.environ['PATH'] = '/tmp/bin:/workspace:' + os.environ['PATH']
os.environ['LD_PRELOAD'] = '/tmp/bin/evil'
with open('/workspace/data.txt', 'w') as f:
    f.write('real data\\n' * 100)
print(json.dumps(sorted(os.listdir('/workspace'))))
"""

PWNED = "print(json.dumps(sorted(n for n in os.listdir('/workspace') if n.startswith('pwned'))))"


def test_planted_programs_and_variables_never_reach_the_helpers(http: httpx.Client) -> None:
    with new_session(http, env=ALLOWED_HOSTILE_ENV) as sid:
        assert run_json(http, sid, "print(json.dumps(os.environ['TAR_OPTIONS']))") == ALLOWED_HOSTILE_ENV["TAR_OPTIONS"]
        assert "data.txt" in run_json(http, sid, PLANT)

        # the files API (the Python helper): reads, lists and writes the real files
        got = http.get(f"/v1/sessions/{sid}/files/data.txt")
        assert got.status_code == 200 and got.content == b"real data\n" * 100, got.text[:300]
        assert http.put(f"/v1/sessions/{sid}/files/up.txt", content=b"uploaded").status_code == 201
        listed = http.get(f"/v1/sessions/{sid}/files")
        assert listed.status_code == 200, listed.text
        assert run_json(http, sid, PWNED) == []

        # pause (tar c) stores the workspace's own bytes, resume (tar x) puts them back
        paused = http.post(f"/v1/sessions/{sid}/pause")
        assert paused.status_code == 200, paused.text
        assert paused.json()["stored_bytes"] < HOSTILE_BYTES // 4, paused.json()
        resumed = http.post(f"/v1/sessions/{sid}/resume")
        assert resumed.status_code == 200, resumed.text
        assert run_json(http, sid, PWNED) == []
        assert run_json(http, sid, "print(json.dumps(open('/workspace/data.txt').read()))") == "real data\n" * 100
        assert run_json(http, sid, "print(json.dumps(open('/workspace/up.txt').read()))") == "uploaded"


def test_a_container_whose_environment_predates_the_rule_still_gets_clean_helpers() -> None:
    """A kernel container started with PATH, LD_PRELOAD and TAR_OPTIONS of the
    session's choosing (a kernel an older gateway started, reattached; or a spec
    that skipped the check): the helpers still run the image's tar and Python,
    and the loader never opens the kernel's library. The backend itself, not
    the models' check, is what makes this hold."""
    env = {
        "PATH": "/tmp/bin:/workspace:/opt/kernel/bin:/usr/bin:/bin",
        "LD_PRELOAD": "/tmp/bin/evil.so",
        **ALLOWED_HOSTILE_ENV,
    }
    with start_kernel(image_for("python"), env=env) as started:
        kernel = started.kernel
        planted = kernel.execute(PROBE + PLANT + "open('/tmp/bin/evil.so', 'w').write('not a library')\n")
        assert planted.status == "ok", planted.errors

        async def use_helpers() -> tuple[int, list[str], bytes]:
            backend, handle = kernel.backend, kernel.handle
            size = sum([len(chunk) async for chunk in read_tree(backend, handle, "/workspace", 30)])
            listing = await WorkspaceFiles(backend, max_upload_bytes=MiB, timeout=30).list(handle)
            stderr = b""
            for argv in (
                [TAR, "-cf", "/dev/null", "-C", "/workspace", "."],
                [*FS_HELPER, "list", "--", ""],
                [PYTHON, "-c", "pass"],  # without -I, as pkg.py's helper runs pip: no user site, no sitecustomize
            ):
                proc = await backend.exec(handle, argv, timeout=30)
                try:
                    while await proc.read():
                        pass
                    assert await proc.exit_code() == 0, proc.stderr
                    stderr += proc.stderr
                finally:
                    await proc.close()
            return size, [entry.path for entry in listing.entries], stderr

        size, names, stderr = asyncio.run(use_helpers())
        assert size < HOSTILE_BYTES // 4, f"{size} bytes: a planted program wrote the stream, not the image's tar"
        assert "data.txt" in names and not [n for n in names if n.startswith("pwned")], names
        assert b"LD_PRELOAD" not in stderr and b"ld.so" not in stderr, stderr
        after = kernel.execute(PROBE + PWNED)
        assert after.stdout.strip().splitlines()[-1] == "[]", after.stdout


BAD_ENV = {
    "PATH": {"PATH": "/tmp/bin:/usr/bin:/bin"},
    "LD_PRELOAD": {"LD_PRELOAD": "/tmp/evil.so"},
    "LD_LIBRARY_PATH": {"LD_LIBRARY_PATH": "/tmp"},
    "LD_AUDIT": {"LD_AUDIT": "/tmp/evil.so"},
    "GCONV_PATH": {"GCONV_PATH": "/tmp"},
    "BASH_ENV": {"BASH_ENV": "/tmp/x.sh"},
    "NUL": {"NUL_INSIDE": "a\x00b"},
    "bad-name": {"A-B": "1"},
    "newline-name": {"FOO\n": "1"},
    "long-value": {"LONG_ONE": "x" * 40_000},
}


@pytest.mark.parametrize("case", list(BAD_ENV))
def test_v1_refuses_loader_variables_nul_bad_names_and_long_values_with_422(http: httpx.Client, case: str) -> None:
    env = BAD_ENV[case]
    error = assert_error(http.post("/v1/sessions", json={"env": env}), 422)
    name = next(iter(env))
    assert repr(name) in error["message"] or f"variable {name} " in error["message"], error
    # nothing was started for it: no 503, no Retry-After, no engine text
    assert "runc" not in error["message"] and "OCI" not in error["message"]


@pytest.mark.parametrize("env", [{"KERNEL_X": "a\x00b"}, {"KERNEL_LONG": "x" * 40_000}, {"KERNEL_A-B": "1"}])
def test_the_jupyter_api_refuses_them_in_its_own_shape(http: httpx.Client, env: dict[str, str]) -> None:
    """Jupyter's own answer to a bad body is a 400 with ``message`` and ``reason``."""
    before = len(http.get("/api/kernels").json())
    resp = http.post("/api/kernels", json={"name": "python3", "env": env})
    assert resp.status_code == 400, resp.text[:300]
    body = resp.json()
    assert set(body) == {"message", "reason"}, body
    assert next(iter(env)) in body["message"] and "Retry-After" not in resp.headers
    assert len(http.get("/api/kernels").json()) == before
