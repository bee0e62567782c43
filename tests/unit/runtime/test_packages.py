"""Package allowlist rules, image targets and pip failure messages (kernelgw.packages);
the file and package endpoints' checks that happen before any container is touched."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from kernelgw.config import Settings
from kernelgw.errors import BadRequest, EngineUnavailable, PackageNotAllowed
from kernelgw.runtime.backends.base import EngineHealth, ExecProcess, KernelHandle, KernelSpec, KernelState
from kernelgw.runtime.packages import (
    check_request,
    image_target,
    normalize_name,
    parse_allowlist,
    pip_failure,
    wheel_name_version,
)
from kernelgw.server import create_app


def test_names_are_normalised_per_pep_503() -> None:
    assert normalize_name("Foo.Bar_baz") == "foo-bar-baz"
    assert normalize_name("SymPy") == "sympy"
    assert normalize_name("typing_extensions") == "typing-extensions"


def test_allowlist_parsing() -> None:
    allowed = parse_allowlist(["SymPy", "tabulate>=0.9", "Typing_Extensions"])
    assert set(allowed) == {"sympy", "tabulate", "typing-extensions"}
    assert str(allowed["tabulate"].specifier) == ">=0.9"
    with pytest.raises(ValueError, match="not a requirement"):
        parse_allowlist(["not a package!"])
    with pytest.raises(ValueError, match="URLs"):
        parse_allowlist(["evil @ https://example.com/evil.whl"])


def test_settings_refuse_a_bad_allowlist() -> None:
    with pytest.raises(ValidationError, match="package_allowlist"):
        Settings(package_allowlist=["ok", "bad name!"])
    assert Settings(package_allowlist=["sympy"]).package_allowlist == ["sympy"]


def test_requests_are_checked_against_the_allowlist() -> None:
    allowed = parse_allowlist(["sympy", "tabulate"])
    reqs = check_request(["SymPy>=1.12", "tabulate"], allowed)
    assert [str(r) for r in reqs] == ["SymPy>=1.12", "tabulate"]
    with pytest.raises(PackageNotAllowed) as info:
        check_request(["sympy", "requests", "Flask"], allowed)
    msg = info.value.message
    assert info.value.status_code == 400 and info.value.code == "package_not_allowed"
    assert "requests, Flask" in msg and "Allowed: sympy, tabulate" in msg and "package_allowlist" in msg


@pytest.mark.parametrize(
    "requested, words",
    [
        ([], "at least one"),
        (["sympy; rm -rf /"], "not a package requirement"),
        (["sympy @ https://evil.example/sympy.whl"], "URLs"),
        (["sympy; python_version < '3'"], "markers"),
        (["x"] * 51, "At most 50"),
    ],
)
def test_malformed_requests(requested: list[str], words: str) -> None:
    with pytest.raises(BadRequest, match=words):
        check_request(requested, parse_allowlist(["sympy", "x"]))


def test_empty_allowlist_means_installing_is_off() -> None:
    with pytest.raises(PackageNotAllowed, match="allowlist is empty"):
        check_request(["sympy"], {})


def test_image_target_from_labels() -> None:
    labels = {
        "kernelgw.python": "3.11",
        "kernelgw.machine": "x86_64",
        "kernelgw.glibc": "2.36",
        "kernelgw.packages": json.dumps({"NumPy": "2.1.0", "typing_extensions": "4.12"}),
    }
    target = image_target(labels)
    assert target is not None
    assert target.python == "3.11" and target.glibc == (2, 36) and target.cache_key == "3.11-x86_64"
    assert target.packages == {"numpy": "2.1.0", "typing-extensions": "4.12"}
    assert target.platforms[0] == "manylinux_2_36_x86_64"
    old = image_target({"kernelgw.python": "3.12"})
    assert old is not None and old.glibc == (2, 17) and old.machine == "x86_64" and old.packages == {}
    assert image_target({"maintainer": "x"}) is None


def test_wheel_names() -> None:
    assert wheel_name_version("SymPy-1.14.0-py3-none-any.whl") == ("sympy", "1.14.0")
    assert wheel_name_version("typing_extensions-4.12.2-py3-none-any.whl") == ("typing-extensions", "4.12.2")


def test_pip_failures_are_explained() -> None:
    reqs = check_request(["nosuch"], parse_allowlist(["nosuch"]))
    missing = "ERROR: Could not find a version that satisfies the requirement nosuch\nERROR: No matching distribution found for nosuch\n"
    assert "No wheel of nosuch fits this image" in pip_failure(missing, reqs)
    conflict = "ERROR: Cannot install x because these package versions have conflicting dependencies.\nERROR: ResolutionImpossible: ..."
    assert "conflicts with the versions the image" in pip_failure(conflict, reqs)
    assert "pip could not resolve nosuch" in pip_failure("ERROR: something else", reqs)


# ------------------------------------------------------------------ HTTP checks before any container


class EngineDown:
    """An engine that is down: anything that reaches it fails, so a 400/413 proves
    the request was refused before the backend was touched."""

    async def start(self, spec: KernelSpec) -> KernelHandle:
        raise EngineUnavailable("The Docker engine does not answer.")

    async def stop(self, handle: KernelHandle) -> None: ...

    async def signal(self, handle: KernelHandle, signum: int) -> None: ...

    async def state(self, handle: KernelHandle, oom_seen: int = 0) -> KernelState:
        return KernelState(status="missing")

    def oom_kills(self, handle: KernelHandle) -> int:
        return 0

    async def reap_orphans(self) -> list[str]:
        return []

    async def list_kernels(self) -> list[object]:
        return []

    async def keep_workspace(self, spec: KernelSpec) -> None:
        return None

    async def end_session(self, session_id: str) -> None:
        return None

    async def reap_except(self, keep: set[str]) -> list[str]:
        return []

    async def exec(
        self, handle: KernelHandle, argv: list[str], *, stdin: bool = False, timeout: float = 120.0
    ) -> ExecProcess:
        raise AssertionError("exec must not be reached")

    async def image_labels(self, image: str) -> dict[str, str] | None:
        raise EngineUnavailable("The Docker engine does not answer.")

    async def health(self, image: str) -> EngineHealth:
        return EngineHealth(engine=False, image=False, detail="connection refused")

    async def close(self) -> None: ...


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings(data_dir=tmp_path, max_upload_bytes=1000, package_allowlist=["sympy"])
    app = create_app(settings, backend=EngineDown())
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
            yield c


async def test_bad_paths_are_refused_before_the_session_is_looked_up(client: httpx.AsyncClient) -> None:
    for method in ("GET", "PUT", "DELETE"):
        for path in ["..%2Fetc%2Fpasswd", "%2Fetc%2Fpasswd", "a%00b", "a/..%2F..%2Fb", "a%5C..%5Cb"]:
            resp = await client.request(method, f"/v1/sessions/nosuch/files/{path}", content=b"x")
            assert resp.status_code == 400, (method, path, resp.text)
            assert resp.json()["error"]["code"] == "invalid_path"
    resp = await client.get("/v1/sessions/nosuch/files", params={"path": "../x"})
    assert resp.status_code == 400


async def test_declared_size_over_the_limit_is_413_before_the_body(client: httpx.AsyncClient) -> None:
    resp = await client.put("/v1/sessions/nosuch/files/big.bin", content=b"x" * 1001)
    assert resp.status_code == 413
    body = resp.json()["error"]
    assert body["code"] == "quota_exceeded" and "per-file limit of 1000 bytes" in body["message"]
    # within the limit, the unknown session is what fails
    resp = await client.put("/v1/sessions/nosuch/files/ok.bin", content=b"x" * 10)
    assert resp.status_code == 404


async def test_non_allowlisted_package_is_refused_before_the_session(client: httpx.AsyncClient) -> None:
    resp = await client.post("/v1/sessions/nosuch/packages", json={"packages": ["requests"]})
    assert resp.status_code == 400
    assert resp.json()["error"]["code"] == "package_not_allowed"
    assert "Allowed: sympy" in resp.json()["error"]["message"]
    resp = await client.post("/v1/sessions/nosuch/packages", json={"packages": "sympy"})
    assert resp.status_code == 422


async def test_images_with_the_engine_down_is_503(client: httpx.AsyncClient) -> None:
    resp = await client.get("/v1/images")
    assert resp.status_code == 503 and resp.json()["error"]["code"] == "engine_unavailable"
