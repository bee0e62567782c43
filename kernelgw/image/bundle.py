"""Build an image of several kernels (``kernelgw.kernels.BUNDLES``) on the Python one.

E2B's code-interpreter sandbox runs python, javascript and typescript, r, java
and bash side by side, each language a context (a kernel of its own) in one
sandbox: its image must hold every kernel. The bundle is built as each language
image is (`kernelgw.image.language`: offline, the Debian packages and wheels
fetched on the host, ``install.sh`` run as root in a network-less container of
the Python image, committed), with every language's ``install.sh`` run in turn
in that one container. Each puts its kernel's start at ``/opt/kernelgw/start-kernel``;
the bundle moves it to ``BUNDLE_START_DIR/<kernel>/start-kernel`` (where a
context starts from) and restores Python's, the sandbox's own kernel.
"""

from __future__ import annotations

from pathlib import Path

import docker
from rich.console import Console

from kernelgw.image.builder import ImageBuildResult
from kernelgw.image.language import (
    BUILD_FORMAT,
    Timings,
    build_committed,
    fetch_debs,
    fetch_wheels,
    read_language_context,
    write_context,
)
from kernelgw.image.names import DEFAULT_TAG
from kernelgw.kernels import BUNDLE_START_DIR, BUNDLES, bundle_image

BUNDLE_FORMAT = b"1"


def bundle_script(kernels: tuple[str, ...]) -> str:
    """The bundle's ``install.sh``: ``kernels[0]`` is the image's own (Python),
    each other one's context is ``/build/<kernel>`` and is installed in turn from
    ``/build`` (a link to it: their scripts name ``/build/...``)."""
    own, *others = kernels
    lines = [
        "set -eu",
        f"install -D -m 0755 /opt/kernelgw/start-kernel {BUNDLE_START_DIR}/{own}/start-kernel",
        "mv /build /bundle",
    ]
    for kernel in others:
        lines += [
            f"echo '==> {kernel}'",
            f"ln -sfn /bundle/{kernel} /build",
            "sh -eu /build/install.sh",
            f"install -D -m 0755 /opt/kernelgw/start-kernel {BUNDLE_START_DIR}/{kernel}/start-kernel",
            "rm /build",
        ]
    lines += [
        f"install -m 0755 {BUNDLE_START_DIR}/{own}/start-kernel /opt/kernelgw/start-kernel",
        "rm -rf /bundle && mkdir /build",  # the caller removes /build after this script
    ]
    return "\n".join(lines) + "\n"


def build_bundle_image(
    name: str,
    tag: str | None = None,
    *,
    python_image: str = DEFAULT_TAG,
    force: bool = False,
    console: Console | None = None,
) -> ImageBuildResult:
    """Build bundle ``name``'s image unless it is up to date."""
    console = console or Console(stderr=True)
    kernels = BUNDLES[name]
    contexts = [read_language_context(kernel) for kernel in kernels[1:]]
    script = bundle_script(kernels)
    files = {f"{ctx.name}/{rel}": data for ctx in contexts for rel, data in ctx.files.items()}
    files |= {"install.sh": script.encode(), "\0bundle-build-format": BUILD_FORMAT + BUNDLE_FORMAT}

    def fill(
        client: docker.DockerClient, context: Path, labels: dict[str, str], root: Path, timings: Timings
    ) -> tuple[list[str], list[str]]:
        """Each language's context in ``context/<kernel>``, its packages and wheels beside it."""
        (context / "install.sh").write_text(script)
        debs: list[str] = []
        wheels: list[str] = []
        for ctx in contexts:
            own = context / ctx.name
            write_context(ctx, own)
            debs += fetch_debs(client, ctx, python_image, own, root, console, timings)
            wheels += fetch_wheels(ctx, labels, own, root, console, timings)
        return debs, wheels

    return build_committed(
        tag=tag or bundle_image(name),
        name=name,
        what=", ".join(kernels),
        files=files,
        python_image=python_image,
        force=force,
        console=console,
        fill=fill,
        labels={"kernelgw.kernel": kernels[0], "kernelgw.kernels": " ".join(kernels)},
    )
