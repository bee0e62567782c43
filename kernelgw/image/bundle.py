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

import json
import shutil
import tempfile
import time
from pathlib import Path

import docker
from rich.console import Console

from kernelgw.image.builder import ImageBuildResult, build_image
from kernelgw.image.cache import build_lock, cache_dir
from kernelgw.image.context import compute_build_hash
from kernelgw.image.engine import connect, get_image, id_of
from kernelgw.image.language import (
    BUILD_FORMAT,
    LanguageContext,
    fetch_debs,
    fetch_wheels,
    install_and_commit,
    read_language_context,
    remove_quietly,
)
from kernelgw.image.names import DEFAULT_TAG, HASH_LABEL
from kernelgw.image.progress import say
from kernelgw.image.wheels import packages_from_wheels
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
    tag = tag or bundle_image(name)
    t_start = time.monotonic()
    timings: list[tuple[str, float]] = []
    base = build_image(tag=python_image, console=console)
    contexts = [read_language_context(kernel) for kernel in kernels[1:]]
    script = bundle_script(kernels)
    files = {f"{ctx.name}/{rel}": data for ctx in contexts for rel, data in ctx.files.items()}
    files |= {"install.sh": script.encode(), "\0bundle-build-format": BUILD_FORMAT + BUNDLE_FORMAT}
    build_hash = compute_build_hash(files, base.image_id)
    client = connect()
    try:
        with build_lock():
            existing = get_image(client, tag)
            if existing is not None and not force and (existing.labels or {}).get(HASH_LABEL) == build_hash:
                say(console, f"{tag} is up to date ({existing.short_id}, on {python_image})")
                return ImageBuildResult(tag, id_of(existing), False, python_image, time.monotonic() - t_start)
            say(console, f"building {tag} ({', '.join(kernels)}) on {python_image}")
            python = get_image(client, python_image)
            labels = (python.labels or {}) if python is not None else {}
            root = cache_dir()
            root.mkdir(parents=True, exist_ok=True)
            context = Path(tempfile.mkdtemp(prefix=f"build-{name}-", dir=root))
            try:
                (context / "install.sh").write_text(script)
                debs: list[str] = []
                wheels: list[str] = []
                for ctx in contexts:
                    debs += _fetch(client, ctx, context, python_image, labels, root, console, timings, wheels)
                t0 = time.monotonic()
                image_id = install_and_commit(
                    client,
                    python_image,
                    context,
                    tag=tag,
                    labels={
                        HASH_LABEL: build_hash,
                        "kernelgw.image": name,
                        "kernelgw.kernel": kernels[0],
                        "kernelgw.kernels": " ".join(kernels),
                        "kernelgw.base": python_image,
                        "kernelgw.base-id": base.image_id,
                        "kernelgw.debs": json.dumps(sorted({d.split("_", 1)[0] for d in debs}), separators=(",", ":")),
                        "kernelgw.packages": json.dumps(packages_from_wheels(wheels), separators=(",", ":")),
                    },
                    console=console,
                )
                timings.append(("install", time.monotonic() - t0))
                if existing is not None and id_of(existing) != image_id:
                    remove_quietly(client, id_of(existing))
            finally:
                shutil.rmtree(context, ignore_errors=True)
            seconds = time.monotonic() - t_start
            say(console, f"built {tag} ({image_id[7:19]}) in {seconds:.0f} s")
            return ImageBuildResult(tag, image_id, True, python_image, seconds, tuple(timings))
    finally:
        client.close()


def _fetch(
    client: docker.DockerClient,
    ctx: LanguageContext,
    context: Path,
    python_image: str,
    labels: dict[str, str],
    root: Path,
    console: Console,
    timings: list[tuple[str, float]],
    wheels: list[str],
) -> list[str]:
    """Write ``ctx``'s files into ``context/<kernel>`` with its Debian packages
    and wheels beside them; returns the packages (the wheels go into ``wheels``)."""
    own = context / ctx.name
    for rel, data in ctx.files.items():
        (own / rel).parent.mkdir(parents=True, exist_ok=True)
        (own / rel).write_bytes(data)
    debs = fetch_debs(client, ctx, python_image, own, root, console, timings)
    wheels += fetch_wheels(ctx, labels, own, root, console, timings)
    return debs
