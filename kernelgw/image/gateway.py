"""Build the gateway's container image (images/gateway) without network inside Docker.

As for the kernel image, everything from outside is fetched on the host first:

1. Resolve the base image as the kernel image does (:func:`.base.resolve_base`:
   ``python:3.12-slim`` when present or pullable, else the debootstrap base).
2. Hash the inputs: the gateway's Dockerfile and entrypoint, the source tree the
   kernelgw wheel is built from (package, image contexts, pyproject.toml, the
   lock) and the base image id. An image whose ``kernelgw.build-hash`` label
   carries that hash is up to date: CI pays for the build once.
3. Build the kernelgw wheel from a copy of the source tree (``pip wheel``), and
   ``pip download`` binary wheels of ``kernelgw[server]``'s dependencies for the
   base's Python, pinned by ``requirements/lock.txt`` (the versions the tests ran).
4. ``docker build --network none``, shown as it goes.

Needs a source checkout (the Dockerfile and the lock are not in the wheel).
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import docker
import docker.errors
from rich.console import Console

from kernelgw.image.base import probe_base, resolve_base
from kernelgw.image.builder import ImageBuildResult
from kernelgw.image.cache import build_lock, cache_dir
from kernelgw.image.docker_build import stream_build
from kernelgw.image.engine import connect, get_image, id_of
from kernelgw.image.errors import LOG_TAIL_LINES, ImageBuildError, WheelDownloadError
from kernelgw.image.names import HASH_LABEL
from kernelgw.image.progress import say
from kernelgw.image.wheels import manylinux_platforms, pip_command, pip_download_command

GATEWAY_TAG = "kernelgw/gateway:latest"
GATEWAY_BUILD_FORMAT = "1"
"""Bumped when the build changes in a way the hashed files do not show."""
GATEWAY_FILES = ("Dockerfile", "entrypoint.py")
SOURCE_DIRS = ("kernelgw", "images")
SOURCE_FILES = ("pyproject.toml", "README.md", "requirements/lock.txt")
SKIPPED_PARTS = frozenset({"__pycache__", "wheels", "gateway"})
"""Not part of the wheel's inputs: byte code, the kernel build's wheelhouse,
and images/gateway itself (hashed on its own)."""


class SourceTreeMissing(ImageBuildError):
    """The gateway image is built from a kernelgw source checkout, and none was found."""

    code = "source_tree_missing"


def source_root() -> Path:
    """The checkout this package runs from (it has ``images/gateway``)."""
    root = Path(__file__).resolve().parents[2]
    if not (root / "images" / "gateway" / "Dockerfile").is_file() or not (root / "pyproject.toml").is_file():
        raise SourceTreeMissing(
            f"No kernelgw source tree at {root} (images/gateway/Dockerfile and pyproject.toml): "
            "build the gateway image from a source checkout (pip install -e .)."
        )
    return root


def source_files(root: Path) -> dict[str, bytes]:
    """The files the kernelgw wheel is built from, by path relative to ``root``."""
    files: dict[str, bytes] = {}
    for name in SOURCE_FILES:
        files[name] = (root / name).read_bytes()
    for top in SOURCE_DIRS:
        for path in sorted((root / top).rglob("*")):
            rel = path.relative_to(root)
            if path.is_file() and not SKIPPED_PARTS.intersection(rel.parts[:-1]) and path.suffix != ".pyc":
                files[rel.as_posix()] = path.read_bytes()
    return files


def gateway_build_hash(gateway: dict[str, bytes], source: dict[str, bytes], base_id: str) -> str:
    h = hashlib.sha256()
    h.update(f"kernelgw-gateway-build:{GATEWAY_BUILD_FORMAT}\n".encode())
    for prefix, files in (("gateway", gateway), ("source", source)):
        for name in sorted(files):
            h.update(f"{prefix}/{name}\0{len(files[name])}\0".encode())
            h.update(files[name])
    h.update(f"base\0{base_id}\n".encode())
    return h.hexdigest()


def _run(cmd: list[str], what: str) -> None:
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        tail = "\n".join(proc.stdout.splitlines()[-LOG_TAIL_LINES:])
        raise WheelDownloadError(f"{what} failed", tail)


def build_kernelgw_wheel(source: dict[str, bytes], dest: Path, work: Path) -> Path:
    """``pip wheel`` of a copy of the source tree (the checkout itself is left
    untouched: no build/ or egg-info from this build)."""
    tree = work / "src"
    for name, data in source.items():
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_bytes(data)
    _run([*pip_command(), "wheel", "--no-deps", "--disable-pip-version-check", "-w", str(dest), str(tree)], "pip wheel")
    (wheel,) = dest.glob("kernelgw-*.whl")
    return wheel


def download_dependencies(
    wheel: Path, dest: Path, lock: Path, *, python_version: str, machine: str, platforms: list[str]
) -> None:
    """Binary wheels of ``kernelgw[server]`` for the image's Python into ``dest``,
    pinned by the lock; the kernel image's per-target wheel cache serves as a
    local index first and as the only one when PyPI cannot be reached."""
    requirements = dest.parent / "gateway-requirements.txt"
    requirements.write_text(f"kernelgw[server] @ {wheel.as_uri()}\n")
    cache = cache_dir() / "wheels" / f"{python_version}-{machine}"
    cache.mkdir(parents=True, exist_ok=True)
    cmd = [
        *pip_download_command(python_version, platforms, dest, cache, requirements),
        "--constraint",
        str(lock),
    ]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        offline = subprocess.run([*cmd, "--no-index"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if offline.returncode != 0:
            tail = "\n".join(proc.stdout.splitlines()[-LOG_TAIL_LINES:])
            raise WheelDownloadError(
                f"pip download of kernelgw[server]'s dependencies for Python {python_version} failed, "
                f"and the wheel cache {cache} does not have them all either.",
                tail,
            )
    for path in dest.glob("*.whl"):
        if not path.name.startswith("kernelgw-") and not (cache / path.name).exists():
            with contextlib.suppress(OSError):
                shutil.copy2(path, cache / path.name)


def build_gateway_image(
    tag: str = GATEWAY_TAG,
    base: str = "auto",
    force: bool = False,
    console: Console | None = None,
) -> ImageBuildResult:
    """Build the gateway image ``tag`` unless it is up to date (same input hash)."""
    t_start = time.monotonic()
    console = console or Console(stderr=True)
    root = source_root()
    gateway = {name: (root / "images" / "gateway" / name).read_bytes() for name in GATEWAY_FILES}
    source = source_files(root)
    timings: list[tuple[str, float]] = []
    client = connect()
    try:
        with build_lock():
            base_name, base_image = resolve_base(client, base, console, timings)
            build_hash = gateway_build_hash(gateway, source, id_of(base_image))
            existing = get_image(client, tag)
            if existing is not None and not force and (existing.labels or {}).get(HASH_LABEL) == build_hash:
                say(console, f"{tag} is up to date ({existing.short_id}, base {base_name})")
                return ImageBuildResult(tag, id_of(existing), False, base_name, time.monotonic() - t_start)
            info = probe_base(client, base_name)
            pyver, machine = info["python"], info["machine"]
            say(console, f"building {tag} on {base_name} (Python {pyver}, {machine})")
            work_root = cache_dir()
            work_root.mkdir(parents=True, exist_ok=True)
            work = Path(tempfile.mkdtemp(prefix="build-gateway-", dir=work_root))
            try:
                context = work / "context"
                wheels = context / "wheels"
                wheels.mkdir(parents=True)
                for name, data in gateway.items():
                    (context / name).write_bytes(data)
                t0 = time.monotonic()
                with console.status("building the kernelgw wheel from the source tree ..."):
                    wheel = build_kernelgw_wheel(source, wheels, work)
                timings.append(("kernelgw wheel", time.monotonic() - t0))
                say(console, f"{wheel.name} built in {timings[-1][1]:.1f} s")
                t0 = time.monotonic()
                with console.status(f"downloading kernelgw[server]'s wheels for Python {pyver} ({machine}) ..."):
                    download_dependencies(
                        wheel,
                        wheels,
                        root / "requirements" / "lock.txt",
                        python_version=pyver,
                        machine=machine,
                        platforms=manylinux_platforms(machine, info["glibc"]),
                    )
                timings.append(("wheels", time.monotonic() - t0))
                count = len(list(wheels.glob("*.whl")))
                say(console, f"{count} wheels ready in {timings[-1][1]:.1f} s")
                t0 = time.monotonic()
                image_id, _ = stream_build(
                    client,
                    context,
                    tag=tag,
                    buildargs={"BASE": base_name},
                    labels={HASH_LABEL: build_hash, "kernelgw.base": base_name, "kernelgw.python": pyver},
                    console=console,
                )
                timings.append(("docker build", time.monotonic() - t0))
            finally:
                shutil.rmtree(work, ignore_errors=True)
            _remove_dangling(client, image_id)
            seconds = time.monotonic() - t_start
            say(console, f"built {tag} ({image_id[7:19]}) in {seconds:.0f} s")
            return ImageBuildResult(tag, image_id, True, base_name, seconds, tuple(timings))
    finally:
        client.close()


def _remove_dangling(client: docker.DockerClient, keep: str) -> None:
    """Earlier gateway images the tag moved away from, and this build's first
    stage; ones a container still uses stay."""
    for label in ("kernelgw.stage=gateway-build", "kernelgw.image=gateway"):
        with contextlib.suppress(docker.errors.APIError):
            for img in client.images.list(filters={"dangling": True, "label": label}):
                if id_of(img) != keep:
                    with contextlib.suppress(docker.errors.APIError):
                        client.images.remove(id_of(img))
