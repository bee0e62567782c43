"""The base image a kernel image is built on, and what runs inside it.

``auto``: ``python:3.12-slim`` when it is present or pullable, otherwise the
debootstrap base (made when missing); ``debootstrap`` forces the latter;
anything else is an image name used as it is. The probe asks the base for
its Python version, machine and glibc, which decide the wheels to download.
"""

from __future__ import annotations

import json
from typing import Any

import docker
import docker.errors
from docker.models.images import Image
from rich.console import Console

from kernelgw.image.debootstrap import build_debootstrap_base
from kernelgw.image.engine import get_image, try_pull
from kernelgw.image.errors import BaseImageError
from kernelgw.image.names import DEBOOTSTRAP_BASE, SLIM_BASE
from kernelgw.image.progress import say


def resolve_base(
    client: docker.DockerClient,
    base: str,
    console: Console,
    timings: list[tuple[str, float]] | None = None,
) -> tuple[str, Image]:
    """(name, image) of the base image to build on; see the module docstring."""
    if base == "auto":
        image = get_image(client, SLIM_BASE) or try_pull(client, SLIM_BASE, console)
        if image is not None:
            return SLIM_BASE, image
        base = "debootstrap"
    if base == "debootstrap":
        image = get_image(client, DEBOOTSTRAP_BASE)
        if image is None:
            say(console, f"no {DEBOOTSTRAP_BASE} yet; making it with debootstrap")
            image = build_debootstrap_base(client, DEBOOTSTRAP_BASE, console=console, timings=timings)
        return DEBOOTSTRAP_BASE, image
    image = get_image(client, base) or try_pull(client, base, console)
    if image is None:
        raise BaseImageError(
            f"Base image {base!r} is neither present locally nor pullable. "
            "Use base='auto' or base='debootstrap' to build an offline base."
        )
    return base, image


_PROBE = (
    "import json, platform, sys; "
    "print(json.dumps({'python': '%d.%d' % sys.version_info[:2], "
    "'machine': platform.machine(), 'libc': platform.libc_ver()}))"
)


def probe_base(client: docker.DockerClient, base: str) -> dict[str, Any]:
    """Python version, machine and libc of ``base`` (runs it, no network)."""
    try:
        out = client.containers.run(base, ["python3", "-c", _PROBE], remove=True, network_mode="none", stderr=True)
    except (docker.errors.ContainerError, docker.errors.APIError) as exc:
        raise BaseImageError(f"Could not run python3 in the base image {base!r}: {exc}") from exc
    text = out.decode(errors="replace").strip().splitlines()
    try:
        info: dict[str, Any] = json.loads(text[-1])
    except (IndexError, ValueError) as exc:
        raise BaseImageError(f"Unexpected answer from python3 in {base!r}: {text!r}") from exc
    libc_name, libc_version = info["libc"]
    if libc_name != "glibc":
        raise BaseImageError(f"Base image {base!r} does not use glibc ({info['libc']}); unsupported.")
    major, minor = (int(x) for x in libc_version.split(".")[:2])
    info["glibc"] = (major, minor)
    return info
