"""Build the kernel image (images/python) with the Docker SDK.

The build never needs network access from inside Docker:

1. Resolve the base image. ``base="auto"``: ``python:3.12-slim`` when it is
   present locally or ``docker pull`` succeeds, otherwise the local
   debootstrap image ``kernelgw/base:bookworm`` (built with ``debootstrap``
   and ``docker import`` when missing). ``base="debootstrap"`` forces the
   latter; anything else is an image name used as it is.
2. Hash the build inputs (Dockerfile, requirements.txt, start-kernel, the
   kernelgw_kernel package, the base image id). When ``tag`` already carries
   that hash in its ``kernelgw.build-hash`` label the build is a no-op.
3. Ask the base image for its Python version, architecture and glibc, and
   ``pip download`` binary wheels for exactly that target on the host (cached
   in ``~/.cache/kernelgw/wheels/<pyver>-<arch>``).
4. ``docker build`` with ``network_mode="none"``, streaming the log as a
   progress display.

Each step has its module: :mod:`.base` (and :mod:`.debootstrap`),
:mod:`.context`, :mod:`.wheels`, :mod:`.docker_build`; this one runs them in
order under a machine-wide lock.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
import time
from pathlib import Path

from rich.console import Console

from kernelgw.image.base import probe_base, resolve_base
from kernelgw.image.cache import build_lock, cache_dir
from kernelgw.image.context import compute_build_hash, default_image_dir, read_context_files, write_context
from kernelgw.image.docker_build import cleanup_after_build, stream_build
from kernelgw.image.engine import connect, get_image, id_of
from kernelgw.image.names import DEBOOTSTRAP_BASE, DEFAULT_TAG, HASH_LABEL, SLIM_BASE
from kernelgw.image.progress import say
from kernelgw.image.wheels import download_wheels, manylinux_platforms, packages_from_wheels


@dataclasses.dataclass(frozen=True)
class ImageBuildResult:
    tag: str
    image_id: str
    built: bool  # False when the image was already up to date (no-op)
    base: str
    seconds: float
    # (phase, seconds) pairs, e.g. ("debootstrap", 38.2), ("wheels", 4.1)
    timings: tuple[tuple[str, float], ...] = ()


def build_image(
    tag: str = DEFAULT_TAG,
    base: str = "auto",
    force: bool = False,
    console: Console | None = None,
    *,
    image_dir: Path | None = None,
) -> ImageBuildResult:
    """Build the kernel image ``tag`` unless it is already up to date.

    Raises :class:`ImageBuildError` (or its subclasses
    :class:`BaseImageError`, :class:`WheelDownloadError`) on failure and
    :class:`kernelgw.errors.EngineUnavailable` when Docker is not answering.
    """
    t_start = time.monotonic()
    console = console or Console(stderr=True)
    image_dir = image_dir or default_image_dir()
    files = read_context_files(image_dir)
    timings: list[tuple[str, float]] = []
    client = connect()
    try:
        with build_lock():
            existing = get_image(client, tag)
            if existing is not None and not force:
                labels = existing.labels or {}
                # base="auto" accepts either automatic base; when the image was
                # built on one that is still here, don't try a pull just to
                # find out that nothing changed.
                candidates = {"auto": (SLIM_BASE, DEBOOTSTRAP_BASE), "debootstrap": (DEBOOTSTRAP_BASE,)}
                previous = labels.get("kernelgw.base")
                if previous in candidates.get(base, (base,)):
                    prev_image = get_image(client, previous)
                    if prev_image is not None and labels.get(HASH_LABEL) == compute_build_hash(
                        files, id_of(prev_image)
                    ):
                        seconds = time.monotonic() - t_start
                        say(console, f"{tag} is up to date ({existing.short_id}, base {previous})")
                        return ImageBuildResult(tag, id_of(existing), False, previous, seconds)

            base_name, base_image = resolve_base(client, base, console, timings)
            build_hash = compute_build_hash(files, id_of(base_image))
            if existing is not None and not force and (existing.labels or {}).get(HASH_LABEL) == build_hash:
                seconds = time.monotonic() - t_start
                say(console, f"{tag} is up to date ({existing.short_id}, base {base_name})")
                return ImageBuildResult(tag, id_of(existing), False, base_name, seconds, tuple(timings))

            info = probe_base(client, base_name)
            pyver, machine = info["python"], info["machine"]
            say(
                console,
                f"building {tag} on {base_name} (Python {pyver}, {machine}, "
                f"glibc {info['glibc'][0]}.{info['glibc'][1]})",
            )
            root = cache_dir()
            root.mkdir(parents=True, exist_ok=True)
            context = Path(tempfile.mkdtemp(prefix="build-", dir=root))
            try:
                write_context(files, context)

                t0 = time.monotonic()
                with console.status(f"downloading wheels for Python {pyver} ({machine}) ..."):
                    wheels = download_wheels(
                        context / "requirements.txt",
                        context / "wheels",
                        python_version=pyver,
                        platforms=manylinux_platforms(machine, info["glibc"]),
                        wheel_cache=root / "wheels" / f"{pyver}-{machine}",
                    )
                dt = time.monotonic() - t0
                timings.append(("wheels", dt))
                say(console, f"{len(wheels)} wheels ready in {dt:.1f} s")

                labels = {
                    HASH_LABEL: build_hash,
                    "kernelgw.base": base_name,
                    "kernelgw.base-id": id_of(base_image),
                    "kernelgw.python": pyver,
                    "kernelgw.machine": machine,
                    "kernelgw.glibc": "{}.{}".format(*info["glibc"]),
                    "kernelgw.packages": json.dumps(packages_from_wheels(wheels), separators=(",", ":")),
                }
                t0 = time.monotonic()
                image_id, seen = stream_build(
                    client,
                    context,
                    tag=tag,
                    buildargs={"BASE": base_name},
                    labels=labels,
                    console=console,
                )
                dt = time.monotonic() - t0
                timings.append(("docker build", dt))
            finally:
                shutil.rmtree(context, ignore_errors=True)

            cleanup_after_build(client, image_id, seen)
            seconds = time.monotonic() - t_start
            say(console, f"built {tag} ({image_id[7:19]}) in {seconds:.0f} s")
            return ImageBuildResult(tag, image_id, True, base_name, seconds, tuple(timings))
    finally:
        client.close()
