"""The kernel image: built by kernelgw.image, runs a kernel the way the gateway does."""

from __future__ import annotations

import json
import os
import secrets
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from kernelgw.config import DEFAULT_KERNEL_UID as UID
from kernelgw.image import HASH_LABEL, build_image, image_exists

pytestmark = pytest.mark.integration

IMAGE = os.environ.get("KERNELGW_IMAGE", "kernelgw/python:latest")


@pytest.fixture(scope="module")
def client() -> Iterator[docker.DockerClient]:
    try:
        c = docker.from_env()
        c.ping()
    except docker.errors.DockerException as exc:
        pytest.fail(f"No Docker engine answers ({exc}); run scripts/ensure-docker.sh", pytrace=False)
    yield c
    c.close()


@pytest.fixture(scope="module")
def built_image(client: docker.DockerClient) -> str:
    """The image, built (or brought up to date) by build_image."""
    build_image(tag=IMAGE)
    assert image_exists(IMAGE)
    return IMAGE


def run_in_image(client: docker.DockerClient, image: str, command: list[str], **kw: Any) -> tuple[int, str]:
    """Run ``command`` without network and read-only; never leaves the container behind."""
    container = client.containers.run(
        image,
        command,
        detach=True,
        network_mode="none",
        read_only=True,
        tmpfs={"/tmp": "size=128m,mode=1777"},
        **kw,
    )
    try:
        status = container.wait(timeout=120)
        return int(status["StatusCode"]), container.logs().decode(errors="replace")
    finally:
        container.remove(force=True)


@pytest.mark.timeout(1200)
def test_build_is_a_noop_the_second_time(built_image: str, client: docker.DockerClient) -> None:
    t0 = time.monotonic()
    result = build_image(tag=built_image)
    elapsed = time.monotonic() - t0
    assert result.built is False  # what makes it quick: nothing built
    print(f"no-op build took {elapsed:.1f} s")
    img = client.images.get(built_image)
    assert result.image_id == img.id
    assert img.labels[HASH_LABEL]
    assert img.labels["kernelgw.image"] == "python"
    packages = json.loads(img.labels["kernelgw.packages"])
    assert {"ipykernel", "numpy", "pandas", "matplotlib", "openpyxl"} <= set(packages)


def test_default_user_is_the_kernel_uid(built_image: str, client: docker.DockerClient) -> None:
    """The image's user is kernelgw's kernel_uid, named (getpass, ``id -un`` work)."""
    assert client.images.get(built_image).attrs["Config"]["User"] == f"{UID}:{UID}"
    code, out = run_in_image(client, built_image, ["sh", "-c", "id -u; id -un"])
    assert (code, out.split()) == (0, [str(UID), "kernel"])


def test_preinstalled_packages_import(built_image: str, client: docker.DockerClient) -> None:
    code, out = run_in_image(
        client,
        built_image,
        [
            "/opt/kernel/bin/python",
            "-c",
            "import ipykernel, numpy, pandas, matplotlib, openpyxl, json; "
            "print(json.load(open('/opt/kernelgw/packages.json'))['numpy'] == numpy.__version__)",
        ],
    )
    assert code == 0, out
    assert out.strip().splitlines()[-1] == "True"


def test_kernel_helper_is_installed_and_labels_name_the_wheel_target(
    built_image: str, client: docker.DockerClient
) -> None:
    """kernelgw_kernel (artifacts extension, file and package helpers) imports in
    isolated mode, and the labels tell the gateway which wheels fit the image."""
    code, out = run_in_image(
        client,
        built_image,
        ["/opt/kernel/bin/python", "-I", "-c", "import kernelgw_kernel.fs, kernelgw_kernel.pkg; print('ok')"],
    )
    assert code == 0 and out.strip().endswith("ok"), out
    labels = client.images.get(built_image).labels
    assert labels["kernelgw.machine"] and labels["kernelgw.glibc"].startswith("2.")


@pytest.mark.timeout(180)
def test_kernel_starts_like_the_gateway_starts_it(built_image: str, client: docker.DockerClient) -> None:
    """Read-only root, the kernel uid, init, no network, tmpfs /tmp and /workspace,
    connection over ipc:// sockets in a bind-mounted /conn; a plot arrives as PNG."""
    from jupyter_client import BlockingKernelClient

    with tempfile.TemporaryDirectory(prefix="kgw-img-") as conn:
        os.chmod(conn, 0o777)
        info = {
            "transport": "ipc",
            "ip": "/conn/k",
            "shell_port": 1,
            "iopub_port": 2,
            "stdin_port": 3,
            "control_port": 4,
            "hb_port": 5,
            "key": secrets.token_hex(32),
            "signature_scheme": "hmac-sha256",
            "kernel_name": "python3",
        }
        path = Path(conn) / "kernel.json"
        path.write_text(json.dumps(info))
        path.chmod(0o666)
        if os.geteuid() == 0:
            os.chown(conn, UID, UID)
            os.chown(path, UID, UID)
        container = client.containers.run(
            built_image,
            ["/opt/kernelgw/start-kernel", "/conn/kernel.json"],
            detach=True,
            read_only=True,
            user=f"{UID}:{UID}",
            init=True,
            network_mode="none",
            tmpfs={"/tmp": "size=128m,mode=1777", "/workspace": f"size=512m,uid={UID},gid={UID},mode=0700"},
            volumes={conn: {"bind": "/conn", "mode": "rw"}},
            working_dir="/workspace",
        )
        kc = BlockingKernelClient()
        try:
            kc.load_connection_info(dict(info, ip=str(Path(conn) / "k")))
            # no heartbeat channel: it declares the kernel dead when the container is
            # slow to start on a loaded machine; readiness is the kernel_info reply
            kc.start_channels(hb=False)
            kc.wait_for_ready(timeout=60)
            code = (
                "import os, matplotlib.pyplot as plt\n"
                "open('out.txt', 'w').write('ok')\n"
                "print(os.getuid(), os.getcwd())\n"
                "plt.plot([1, 2]); plt.show()\n"
            )
            msg_id = kc.execute(code)
            msgs = []
            while True:
                msg = kc.get_iopub_msg(timeout=60)
                if msg["parent_header"].get("msg_id") != msg_id:
                    continue
                if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                    break
                msgs.append(msg)
            reply = kc.get_shell_msg(timeout=10)
            assert reply["content"]["status"] == "ok", reply["content"]
            text = "".join(m["content"]["text"] for m in msgs if m["msg_type"] == "stream")
            assert text.strip() == f"{UID} /workspace"
            assert any(m["msg_type"] == "display_data" and "image/png" in m["content"]["data"] for m in msgs)
        finally:
            kc.stop_channels()
            logs = container.logs().decode(errors="replace")
            container.remove(force=True)
        assert "Traceback" not in logs, logs
