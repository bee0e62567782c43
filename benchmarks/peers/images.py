"""The offline image the Kernel-Gateway-based peers run from (stock Kernel Gateway,
AutoGen's DockerJupyterServer, smolagents' DockerExecutor).

All three ship a Dockerfile that installs ``jupyter_kernel_gateway`` and ipykernel
into a registry base (python:3.12-bullseye, quay.io/jupyter/docker-stacks-foundation);
no registry is reachable here, so the same thing is built on kernelgw's own kernel
image: the wheels are downloaded on the host, the build runs with ``--network none``.
One image serves the three: its command starts the Kernel Gateway on 0.0.0.0:8888
with the token from ``TOKEN`` (AutoGen's variable) or ``KG_AUTH_TOKEN`` (smolagents',
which the Kernel Gateway also reads itself). Kept as a cache: the tag names the
Kernel Gateway version and the base image."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

PACKAGE = "jupyter_kernel_gateway"
REPO = "kernelgw-peer/kernel-gateway"
PORT = 8888

DOCKERFILE = """\
FROM {base}
USER 0:0
COPY wheels /tmp/wheels
RUN /opt/kernel/bin/python -m pip install --no-index --find-links /tmp/wheels {package}=={version} \\
 && rm -rf /tmp/wheels \\
 && mkdir -p /tmp/home /workspace && chown 61000:61000 /tmp/home /workspace && chmod 1777 /tmp
USER 61000:61000
ENV TOKEN=""
EXPOSE {port}
CMD ["/bin/sh", "-c", "exec /opt/kernel/bin/jupyter kernelgateway --KernelGatewayApp.ip=0.0.0.0 \\
--KernelGatewayApp.port={port} --KernelGatewayApp.auth_token=\\"${{TOKEN:-${{KG_AUTH_TOKEN:-}}}}\\" \\
--JupyterApp.answer_yes=true --JupyterWebsocketPersonality.list_kernels=true"]
"""


def _download(dest: Path, spec: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "--python-version", "3.11",
         "--platform", "manylinux2014_x86_64", "--dest", str(dest), spec],
        capture_output=True,
        text=True,
    )  # fmt: skip
    if proc.returncode:
        raise RuntimeError(f"pip download {spec} failed:\n{proc.stderr[-2000:]}")


def _remove_stale(client: Any, keep: str) -> None:
    """Earlier builds of this image (another Kernel Gateway version, or an older base
    image): only this module makes tags in REPO, so they are ours to remove."""
    for image in client.images.list(name=REPO):
        if keep not in image.tags:
            for t in image.tags:
                with contextlib.suppress(Exception):
                    client.images.remove(t, noprune=False)
                    print(f"removed the stale peer image {t}", flush=True)


def ensure_kernel_gateway_image(base: str) -> tuple[str, str]:
    """(image tag, jupyter_kernel_gateway version): built when missing, else reused."""
    import docker

    client = docker.from_env()
    try:
        base_id = client.images.get(base).id.split(":")[-1][:12]
        with tempfile.TemporaryDirectory(prefix="kgwb-peer-") as ctx:
            wheels = Path(ctx) / "wheels"
            _download(wheels, PACKAGE)
            version = next(p.name.split("-")[1] for p in wheels.glob("jupyter_kernel_gateway-*.whl"))
            tag = f"{REPO}:{version}-{base_id}"
            _remove_stale(client, keep=tag)
            try:
                client.images.get(tag)
                return tag, version
            except docker.errors.ImageNotFound:
                pass
            (Path(ctx) / "Dockerfile").write_text(
                DOCKERFILE.format(base=base, package=PACKAGE, version=version, port=PORT)
            )
            print(f"building {tag} offline ...", flush=True)
            subprocess.run(
                ["docker", "build", "--quiet", "--network", "none", "-t", tag, ctx],
                check=True,
                stdout=subprocess.DEVNULL,
            )
            return tag, version
    finally:
        client.close()
