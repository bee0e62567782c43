"""The gateway's container image (images/gateway): built with no network inside
Docker, run with the host's engine socket mounted, it serves sessions whose
kernels are the host engine's network-less containers, and leaves nothing
behind when it stops."""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import docker.errors
import httpx
import pytest

from kernelgw.image import HASH_LABEL
from kernelgw.image.gateway import GATEWAY_TAG, build_gateway_image
from tests.integration.conftest import IMAGE, RUNTIME, assert_nothing_left, remove_everything
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

NAME = f"gi{os.getpid()}"
RUNTIME_DIR = Path(f"/tmp/kgwi-{os.getpid()}")


@pytest.fixture(scope="module")
def gateway_image(docker_client: docker.DockerClient) -> str:
    """Built once per input hash: a second build of unchanged inputs is a no-op."""
    first = build_gateway_image(GATEWAY_TAG)
    print(f"gateway image: built={first.built} in {first.seconds:.1f}s {first.timings}")
    again = build_gateway_image(GATEWAY_TAG)
    assert not again.built, "an unchanged gateway image was built again"
    assert again.image_id == first.image_id
    labels = docker_client.images.get(GATEWAY_TAG).labels or {}
    assert labels.get(HASH_LABEL), "the image carries no build hash"
    return GATEWAY_TAG


def run_gateway(client: docker.DockerClient, image: str, **overrides: Any) -> Any:
    """The gateway container as compose.yaml runs it: the socket, the runtime
    directory at the same path, the host's name; its port on loopback."""
    options: dict[str, Any] = dict(
        detach=True,
        name=f"kgwi-{NAME}",
        environment={
            "KERNELGW_GATEWAY_NAME": NAME,
            "KERNELGW_RUNTIME_DIR": str(RUNTIME_DIR),
            "KERNELGW_RUNTIME": RUNTIME,
            "KERNELGW_IMAGE": IMAGE,
            "KERNELGW_AUTH": "required",
            "KERNELGW_POOL_SIZE": "0",
            "KERNELGW_ON_SHUTDOWN": "stop",
            "KERNELGW_MEMORY_MB": "512",
        },
        volumes={
            "/var/run/docker.sock": {"bind": "/var/run/docker.sock", "mode": "rw"},
            str(RUNTIME_DIR): {"bind": str(RUNTIME_DIR), "mode": "rw"},
            "/etc/hostname": {"bind": "/etc/host-hostname", "mode": "ro"},
        },
        ports={"8000/tcp": ("127.0.0.1", None)},
        init=True,
        # compose.yaml's hardening: only the capabilities the gateway needs
        cap_drop=["ALL"],
        cap_add=["CHOWN", "DAC_OVERRIDE", "FOWNER"],
        read_only=True,
        tmpfs={"/tmp": "", "/var/lib/kernelgw": "", "/var/cache/kernelgw": ""},
        security_opt=["no-new-privileges"],
    )
    options.update(overrides)
    return client.containers.run(image, **options)


@pytest.fixture
def gateway_container(docker_client: docker.DockerClient, gateway_image: str) -> Iterator[Any]:
    RUNTIME_DIR.mkdir(exist_ok=True)
    container = run_gateway(docker_client, gateway_image)
    try:
        yield container
    finally:
        try:
            container.remove(force=True)
        except docker.errors.NotFound:
            pass
        remove_everything(docker_client, NAME)
        shutil.rmtree(RUNTIME_DIR, ignore_errors=True)


def base_url(container: Any) -> str:
    container.reload()
    (binding,) = container.attrs["NetworkSettings"]["Ports"]["8000/tcp"]
    return f"http://127.0.0.1:{binding['HostPort']}"


def ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_gateway_container_serves_network_less_kernels_and_leaves_nothing(
    docker_client: docker.DockerClient, gateway_container: Any
) -> None:
    url = base_url(gateway_container)
    wait_until(lambda: ready(url), "the gateway container's /readyz", timeout=120, interval=0.2)
    assert httpx.get(f"{url}/v1/sessions", timeout=5).status_code == 401, "auth=required should refuse no key"

    code, out = gateway_container.exec_run(["kernelgw", "keys", "create", "test", "--admin"])
    assert code == 0, out
    key = next(word for word in out.decode().split() if word.startswith("kgw_"))
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60) as http:
        t0 = time.monotonic()
        resp = http.post("/v1/sessions", json={})
        assert resp.status_code == 201, resp.text
        sid = resp.json()["id"]
        print(f"session through the gateway container: {time.monotonic() - t0:.2f}s")
        result = http.post(f"/v1/sessions/{sid}/execute", json={"code": "1+1"}).json()
        assert [e["data"]["text/plain"] for e in result["events"] if e["type"] == "result"] == ["2"]

        # the kernel is a container of the host's engine, with no network at all
        (kernel,) = docker_client.containers.list(filters={"label": [f"kernelgw.gateway={NAME}", "kernelgw.kernel"]})
        assert kernel.attrs["HostConfig"]["NetworkMode"] == "none"
        probe = (
            "import socket\n"
            "print(sorted(l.split(':')[0].strip() for l in open('/proc/net/dev').readlines()[2:]))\n"
            "try:\n"
            "    socket.create_connection(('1.1.1.1', 53), timeout=2)\n"
            "    print('connected')\n"
            "except OSError as exc:\n"
            "    print('refused', exc.errno)\n"
        )
        events = http.post(f"/v1/sessions/{sid}/execute", json={"code": probe}).json()["events"]
        text = "".join(e["text"] for e in events if e["type"] == "stream")
        assert text.splitlines()[0] == "['lo']", text
        assert text.splitlines()[1].startswith("refused"), text
        # its sockets are in the runtime directory the host and the gateway share
        assert any(m["Source"].startswith(f"{RUNTIME_DIR}/") for m in kernel.attrs["Mounts"])

    # SIGTERM: the gateway drains, stops its kernels (on_shutdown=stop) and exits 0
    gateway_container.stop(timeout=60)
    assert gateway_container.wait(timeout=60)["StatusCode"] == 0, gateway_container.logs()[-2000:]
    assert_nothing_left(docker_client, NAME)
    # the uid lock and reservations are the host's (every gateway there shares
    # them, entrypoint.py puts them in the runtime directory): no reservation of
    # this gateway's may outlive it
    uids = RUNTIME_DIR / ".uids"
    reservations = json.loads((uids / "uids.json").read_text())
    assert not [holder for holder, _ in reservations.values() if holder.startswith(f"{NAME}/")], reservations
    left = [p.name for p in RUNTIME_DIR.rglob("*") if not p.name.endswith(".lock") and uids not in p.parents]
    left = [name for name in left if name != ".uids"]
    assert not left, f"left in the runtime directory: {left}"


def test_gateway_container_refuses_a_runtime_dir_not_shared_with_the_host(
    docker_client: docker.DockerClient, gateway_image: str
) -> None:
    """Mounted at another path, the kernels' socket directories would not be
    where the engine looks: the container says so and exits instead of serving."""
    RUNTIME_DIR.mkdir(exist_ok=True)
    elsewhere = RUNTIME_DIR.with_name(RUNTIME_DIR.name + "-elsewhere")
    elsewhere.mkdir(exist_ok=True)
    container = run_gateway(
        docker_client,
        gateway_image,
        volumes={
            "/var/run/docker.sock": {"bind": "/var/run/docker.sock", "mode": "rw"},
            str(elsewhere): {"bind": str(RUNTIME_DIR), "mode": "rw"},
        },
        ports={},
    )
    try:
        status = container.wait(timeout=120)["StatusCode"]
        logs = container.logs().decode(errors="replace")
    finally:
        container.remove(force=True)
        elsewhere.rmdir()
    assert status == 2, logs
    assert f"-v {RUNTIME_DIR}:{RUNTIME_DIR}" in logs, logs
    assert_nothing_left(docker_client, NAME)


def test_gateway_container_loads_a_missing_kernel_image_from_an_archive(
    docker_client: docker.DockerClient, gateway_image: str, tmp_path: Path
) -> None:
    """A node without a registry gets the kernel image from a `docker save`
    tarball (KERNELGW_IMAGE_ARCHIVE): loaded before the gateway serves. A tiny
    stand-in image keeps the test fast; /healthz reports it present."""
    tag = f"kgwi-{os.getpid()}/kernel:archive"
    container = None
    try:
        context = io.BytesIO()
        with tarfile.open(fileobj=context, mode="w") as tar:
            for name, data in {
                "Dockerfile": b"FROM scratch\nCOPY f /f\nLABEL kernelgw.test=archive\n",
                "f": b"x",
            }.items():
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        context.seek(0)
        image, _ = docker_client.images.build(
            fileobj=context, custom_context=True, tag=tag, rm=True, network_mode="none"
        )
        archive = tmp_path / "kernel.tar"
        with archive.open("wb") as fh:
            for chunk in image.save(named=True):
                fh.write(chunk)
        docker_client.images.remove(tag)
        RUNTIME_DIR.mkdir(exist_ok=True)
        container = run_gateway(
            docker_client,
            gateway_image,
            environment={
                "KERNELGW_GATEWAY_NAME": NAME,
                "KERNELGW_RUNTIME_DIR": str(RUNTIME_DIR),
                "KERNELGW_IMAGE": tag,
                "KERNELGW_IMAGE_ARCHIVE": "/archive/kernel.tar",
                "KERNELGW_POOL_SIZE": "0",
                "KERNELGW_AUTH": "required",
            },
            volumes={
                "/var/run/docker.sock": {"bind": "/var/run/docker.sock", "mode": "rw"},
                str(RUNTIME_DIR): {"bind": str(RUNTIME_DIR), "mode": "rw"},
                str(tmp_path): {"bind": "/archive", "mode": "ro"},
            },
        )
        url = base_url(container)
        wait_until(lambda: ready(url), "the gateway container's /readyz", timeout=120, interval=0.2)
        health = httpx.get(f"{url}/healthz", timeout=5).json()
        assert health["image"] is True and health["image_name"] == tag, health
        assert (docker_client.images.get(tag).labels or {}).get("kernelgw.test") == "archive"
        assert "loading the kernel image" in container.logs().decode(errors="replace")
    finally:
        if container is not None:
            container.remove(force=True)
        remove_everything(docker_client, NAME)
        shutil.rmtree(RUNTIME_DIR, ignore_errors=True)
        try:
            docker_client.images.remove(tag)
        except docker.errors.ImageNotFound:
            pass
