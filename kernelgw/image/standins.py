"""Local stand-ins for the PostgreSQL and HAProxy images compose.yaml names.

Where no registry answers, ``postgres`` and ``haproxy`` cannot be pulled, so
``compose.yaml`` (and ``scripts/check-deploy.sh``) can use these instead:
Debian's packages on the debootstrap base, the .deb files downloaded on the
host, ``docker build --network none``. Each is built from ``deploy/standins/<name>``
(a Dockerfile, ``debs.txt``, maybe an entrypoint) and skipped when its
``kernelgw.build-hash`` label matches its inputs.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from rich.console import Console

from kernelgw.image.base import resolve_base
from kernelgw.image.builder import ImageBuildResult
from kernelgw.image.cache import build_lock, cache_dir
from kernelgw.image.context import compute_build_hash
from kernelgw.image.debs import download_debs, image_dpkg_status, read_package_list
from kernelgw.image.docker_build import stream_build
from kernelgw.image.engine import connect, get_image, id_of
from kernelgw.image.errors import ImageBuildError
from kernelgw.image.names import DEBOOTSTRAP_BASE, HASH_LABEL
from kernelgw.image.progress import say

STANDINS = {"postgres": "kernelgw/postgres:15", "haproxy": "kernelgw/haproxy:2.6"}
"""Stand-in directory name under ``deploy/standins`` -> the tag it is built as."""


def build_standin(
    directory: Path, tag: str, *, force: bool = False, console: Console | None = None
) -> ImageBuildResult:
    """Build ``directory`` (Dockerfile + debs.txt) as ``tag`` on the debootstrap base."""
    t_start = time.monotonic()
    console = console or Console(stderr=True)
    if not (directory / "Dockerfile").is_file():
        raise ImageBuildError(f"No stand-in image directory at {directory} (its Dockerfile is missing).")
    files = {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}
    client = connect()
    try:
        with build_lock():
            base_name, base_image = resolve_base(client, "debootstrap", console)
            build_hash = compute_build_hash({**files, "\0stand-in": b"1"}, id_of(base_image))
            existing = get_image(client, tag)
            if existing is not None and not force and (existing.labels or {}).get(HASH_LABEL) == build_hash:
                say(console, f"{tag} is up to date ({existing.short_id})")
                return ImageBuildResult(tag, id_of(existing), False, base_name, time.monotonic() - t_start)
            root = cache_dir()
            root.mkdir(parents=True, exist_ok=True)
            context = Path(tempfile.mkdtemp(prefix="build-standin-", dir=root))
            try:
                for name, data in files.items():
                    (context / name).parent.mkdir(parents=True, exist_ok=True)
                    (context / name).write_bytes(data)
                    (context / name).chmod((directory / name).stat().st_mode & 0o777)
                packages = read_package_list(directory / "debs.txt")
                with console.status(f"downloading Debian packages for {tag}: {' '.join(packages)} ..."):
                    status = image_dpkg_status(client, base_name, context / "dpkg-status")
                    debs = download_debs(packages, status, context / "debs", root / "debs")
                    status.unlink()
                say(console, f"{len(debs)} Debian packages for {tag}")
                image_id, _ = stream_build(
                    client,
                    context,
                    tag=tag,
                    buildargs={"BASE": DEBOOTSTRAP_BASE},
                    labels={HASH_LABEL: build_hash, "kernelgw.base": base_name},
                    console=console,
                )
            finally:
                shutil.rmtree(context, ignore_errors=True)
            seconds = time.monotonic() - t_start
            say(console, f"built {tag} ({image_id[7:19]}) in {seconds:.0f} s")
            return ImageBuildResult(tag, image_id, True, base_name, seconds)
    finally:
        client.close()


def build_standins(root: Path, *, force: bool = False, console: Console | None = None) -> list[ImageBuildResult]:
    """Every stand-in of :data:`STANDINS`, from ``root/deploy/standins``."""
    return [
        build_standin(root / "deploy" / "standins" / name, tag, force=force, console=console)
        for name, tag in STANDINS.items()
    ]
