"""Offline package installs into network-less sessions, and the image listing.

The gateway resolves wheels on the host (from its wheel cache, downloading with
the host's network when the cache lacks them) and installs them into the
session's package directory through the engine; the kernel never has network.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from kernelgw.client import Client
from kernelgw.errors import ClientError
from tests.integration.conftest import RUNTIME, RunningGateway, gateway_settings, run, start_gateway, stdout

pytestmark = pytest.mark.integration

ALLOWLIST = ["sympy", "tabulate", "numpy", "ujson", "kernelgw-test-no-such-package-x7q"]


@pytest.fixture(scope="module")
def pkg_gateway(gateway: RunningGateway) -> Iterator[RunningGateway]:
    gw = start_gateway(gateway_settings(gateway_name=f"{gateway.settings.gateway_name}p", package_allowlist=ALLOWLIST))
    yield gw
    gw.stop()


@pytest.fixture(scope="module")
def pkg_http(pkg_gateway: RunningGateway) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=pkg_gateway.url, timeout=600) as client:
        yield client


@pytest.fixture
def sid(pkg_http: httpx.Client) -> Iterator[str]:
    resp = pkg_http.post("/v1/sessions", json={})
    assert resp.status_code == 201, resp.text
    yield resp.json()["id"]
    pkg_http.delete(f"/v1/sessions/{resp.json()['id']}")


def install(http: httpx.Client, sid: str, *packages: str) -> httpx.Response:
    return http.post(f"/v1/sessions/{sid}/packages", json={"packages": list(packages)})


def session_packages_dir(http: httpx.Client, sid: str) -> list[str]:
    out = stdout(run(http, sid, "import os; print(sorted(os.listdir('/opt/kernelgw/packages')))"))
    return eval(out)  # a list literal printed by the kernel


NO_NETWORK = """\
import socket
try:
    socket.create_connection(("pypi.org", 443), timeout=3)
    print("online")
except OSError as exc:
    print("offline", type(exc).__name__)
"""


@pytest.mark.timeout(600)
def test_allowlisted_package_installs_into_a_networkless_kernel_without_restart(
    pkg_http: httpx.Client, sid: str, output_dir: Path
) -> None:
    assert stdout(run(pkg_http, sid, NO_NETWORK)).startswith("offline")
    run(pkg_http, sid, "kept = 41")
    before = run(pkg_http, sid, "import sympy")
    assert before["status"] == "error" and "ModuleNotFoundError" in before["events"][-2]["ename"]

    t0 = time.perf_counter()
    resp = install(pkg_http, sid, "sympy")
    elapsed = time.perf_counter() - t0
    assert resp.status_code == 200, resp.text
    body = resp.json()
    installed = {p["name"]: p["version"] for p in body["installed"]}
    assert set(installed) == {"sympy", "mpmath"}  # the dependency came along
    assert body["already_present"] == []

    result = run(
        pkg_http,
        sid,
        "import sympy\nx = sympy.Symbol('x')\nprint(sympy.integrate(x**2, x), sympy.__version__, kept + 1)",
    )
    assert result["status"] == "ok", result
    assert stdout(result).split() == ["x**3/3", installed["sympy"], "42"]  # same kernel: state kept
    assert stdout(run(pkg_http, sid, NO_NETWORK)).startswith("offline")
    (output_dir / "package-install.txt").write_text(f"sympy+mpmath install: {elapsed:.2f} s\n")

    # asking again does nothing; a preinstalled package is reported, not reinstalled
    again = install(pkg_http, sid, "SymPy", "numpy").json()
    assert again["installed"] == []
    sources = {p["name"]: p["source"] for p in again["already_present"]}
    assert sources == {"sympy": "session", "numpy": "image"}
    assert not any(name.startswith("numpy") for name in session_packages_dir(pkg_http, sid))


@pytest.mark.timeout(600)
def test_package_with_a_native_extension_imports_from_the_package_mount(pkg_http: httpx.Client, sid: str) -> None:
    # ujson is one C extension module and nothing else (no pure-Python fallback),
    # not in the image: its import maps a shared object from the package tmpfs,
    # which fails ("failed to map segment from shared object") if it is noexec
    resp = install(pkg_http, sid, "ujson")
    assert resp.status_code == 200, resp.text
    assert [p["name"] for p in resp.json()["installed"]] == ["ujson"]
    code = "import ujson\nprint(ujson.__file__)\nprint(ujson.dumps({'a': [1, 2.5, None]}))"
    result = run(pkg_http, sid, code)
    assert result["status"] == "ok", [e.get("traceback_text") for e in result["events"] if e["type"] == "error"]
    path, dumped = stdout(result).split()
    assert path.startswith("/opt/kernelgw/packages/") and path.endswith(".so"), path
    assert dumped == '{"a":[1,2.5,null]}'


# What the kernel's uid can write and then execute, per mount (docs/security.md,
# "Mounts: exec and noexec"): a copy of /bin/true, run from each.
EXEC_FROM_MOUNTS = """\
import errno, json, os, shutil, subprocess
result = {}
for d in ('/opt/kernelgw/packages', '/tmp', '/workspace', '/dev/shm'):
    path = os.path.join(d, 'kgw-true')
    shutil.copy('/bin/true', path)
    os.chmod(path, 0o755)
    try:
        result[d] = 'ok' if subprocess.run([path]).returncode == 0 else 'failed'
    except OSError as exc:
        result[d] = errno.errorcode.get(exc.errno, str(exc.errno))
    os.unlink(path)
flags = {'nosuid': os.ST_NOSUID, 'nodev': os.ST_NODEV, 'noexec': os.ST_NOEXEC}
options = {d: sorted(k for k, f in flags.items() if os.statvfs(d).f_flag & f) for d in result}
print(json.dumps({'exec': result, 'options': options}))
"""


MOUNT_FLAGS_SHOWN = {
    "runc": {
        "/opt/kernelgw/packages": ["nodev", "nosuid"],
        "/tmp": ["nodev", "nosuid"],
        "/workspace": ["nodev", "nosuid"],
        "/dev/shm": ["nodev", "noexec", "nosuid"],
    },
    "runsc": {"/opt/kernelgw/packages": [], "/tmp": [], "/workspace": [], "/dev/shm": []},
}


def test_mounts_are_exec_or_noexec_as_documented(pkg_http: httpx.Client, sid: str) -> None:
    result = run(pkg_http, sid, EXEC_FROM_MOUNTS)
    assert result["status"] == "ok", result["events"][-2:]
    found = json.loads(stdout(result))
    assert found["exec"] == {
        "/opt/kernelgw/packages": "ok",
        "/tmp": "ok",
        "/workspace": "ok",
        "/dev/shm": "EACCES",
    }, found
    # gVisor 20221219 reports no mount flags (statvfs, mountinfo), though it applies
    # them (the exec results above): an explicit expectation per runtime
    assert found["options"] == MOUNT_FLAGS_SHOWN[RUNTIME], found


def test_not_allowlisted_package_is_refused_and_nothing_changes(pkg_http: httpx.Client, sid: str) -> None:
    before = session_packages_dir(pkg_http, sid)
    resp = install(pkg_http, sid, "requests")
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert error["code"] == "package_not_allowed"
    assert "requests" in error["message"] and "sympy" in error["message"] and "tabulate" in error["message"]
    mixed = install(pkg_http, sid, "tabulate", "flask")
    assert mixed.status_code == 400 and "flask" in mixed.json()["error"]["message"]
    assert session_packages_dir(pkg_http, sid) == before
    assert run(pkg_http, sid, "import requests")["status"] == "error"
    assert run(pkg_http, sid, "1 + 1")["status"] == "ok"


def test_unavailable_and_conflicting_packages_get_clear_errors(pkg_http: httpx.Client, sid: str) -> None:
    resp = install(pkg_http, sid, "kernelgw-test-no-such-package-x7q")
    assert resp.status_code == 422, resp.text
    assert resp.json()["error"]["code"] == "package_unavailable"
    assert "kernelgw-test-no-such-package-x7q" in resp.json()["error"]["message"]

    resp = install(pkg_http, sid, "numpy<2")
    assert resp.status_code == 422
    assert "preinstalled" in resp.json()["error"]["message"]

    for bad in (["sympy; import os"], []):
        assert install(pkg_http, sid, *bad).status_code == 400
    assert run(pkg_http, sid, "1 + 1")["status"] == "ok"


def test_offline_gateway_installs_only_from_its_cache(gateway: RunningGateway, tmp_path: Path) -> None:
    gw = start_gateway(
        gateway_settings(
            gateway_name=f"{gateway.settings.gateway_name}o",
            package_allowlist=["tabulate"],
            package_download=False,
            wheel_cache_dir=tmp_path / "empty-cache",
        )
    )
    try:
        with httpx.Client(base_url=gw.url, timeout=300) as http:
            sid = http.post("/v1/sessions", json={}).json()["id"]
            resp = install(http, sid, "tabulate")
            assert resp.status_code == 422
            assert "wheel cache" in resp.json()["error"]["message"] and "offline" in resp.json()["error"]["message"]
            http.delete(f"/v1/sessions/{sid}")
    finally:
        gw.stop()


def test_images_list_preinstalled_packages_and_the_allowlist(pkg_http: httpx.Client) -> None:
    resp = pkg_http.get("/v1/images")
    assert resp.status_code == 200
    body = resp.json()
    (image,) = body["images"]
    assert image["default"] is True and image["present"] is True
    assert image["python"] and image["python"].startswith("3.")
    assert {"numpy", "pandas", "matplotlib", "openpyxl", "ipykernel"} <= set(image["packages"])
    assert body["package_allowlist"] == ALLOWLIST


def test_sdk_install_and_images(pkg_gateway: RunningGateway) -> None:
    with Client(pkg_gateway.url) as client, client.session() as session:
        result = session.install("tabulate")
        assert [p.name for p in result.installed] == ["tabulate"]
        assert session.run("import tabulate; print(tabulate.tabulate([[1, 2]]))").stdout.splitlines()[1] == "1  2"
        with pytest.raises(ClientError) as info:
            session.install(["requests"])
        assert info.value.status_code == 400 and info.value.code == "package_not_allowed"
        images = client.images()
        assert "pandas" in images.images[0].packages and images.package_allowlist == ALLOWLIST
