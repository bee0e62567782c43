"""Build the image of a kernel for another language (``images/<name>``) on the Python one.

Every kernel image starts from the Python kernel image: the gateway's helpers
(files, artifacts, the shim in front of other kernels) are Python, and the
layers are shared, so a language costs only what it adds. The build has no
network, like the Python one:

1. Build (or find up to date) the Python kernel image.
2. Hash the language's directory and the Python image id; an image carrying
   that hash in its ``kernelgw.build-hash`` label is up to date.
3. On the host, download the Debian packages of ``debs.txt`` that the Python
   image lacks (:mod:`.debs`) and the wheels of ``requirements.txt`` for the
   image's Python (:mod:`.wheels`).
4. Run ``install.sh`` as root in a network-less container of the Python image,
   the context mounted read-only at ``/build``, and commit the container as
   the image (user, working directory and command as the Python image's).

Run-and-commit instead of ``docker build``: Docker's legacy builder would keep
the copied .deb files in a layer of the image even after they are removed.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import tarfile
import tempfile
import time
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path

import docker
import docker.errors
from rich.console import Console

from kernelgw.image.builder import ImageBuildResult, build_image
from kernelgw.image.cache import build_lock, cache_dir
from kernelgw.image.context import compute_build_hash, default_image_dir
from kernelgw.image.debs import download_debs, image_dpkg_status, read_package_list
from kernelgw.image.engine import connect, get_image, id_of
from kernelgw.image.errors import LOG_TAIL_LINES, ImageBuildError
from kernelgw.image.names import DEFAULT_TAG, HASH_LABEL
from kernelgw.image.progress import say, spinner
from kernelgw.image.wheels import download_wheels, manylinux_platforms, packages_from_wheels
from kernelgw.kernels import DEFAULT_KERNEL, profile

INSTALL_TIMEOUT_S = 1800
COMMIT_CHANGES = (
    "USER 61000:61000",
    "WORKDIR /workspace",
    'CMD ["/opt/kernelgw/start-kernel", "/conn/kernel.json"]',
)
"""The Python image's run-time settings, restated: a commit keeps the base's
config only where these do not override it, and the install ran as root."""
BUILD_FORMAT = b"2"
"""Part of the build hash: bumped when the way these images are made changes in a
way their files do not show (2: the context is copied in, no VOLUME /build)."""


@dataclasses.dataclass(frozen=True)
class LanguageContext:
    name: str
    directory: Path
    files: dict[str, bytes]


def language_dir(name: str) -> Path:
    """``images/<name>``: beside the Python image's directory, in a source tree or
    in the copy a wheel installs."""
    return default_image_dir().parent / name


def read_language_context(name: str, directory: Path | None = None) -> LanguageContext:
    directory = directory or language_dir(name)
    if not (directory / "install.sh").is_file():
        raise ImageBuildError(f"No image directory for the kernel {name!r}: {directory}/install.sh is missing.")
    files = {
        p.relative_to(directory).as_posix(): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }
    return LanguageContext(name, directory, files)


def build_kernel_image(
    name: str,
    tag: str | None = None,
    *,
    python_image: str = DEFAULT_TAG,
    force: bool = False,
    console: Console | None = None,
    directory: Path | None = None,
) -> ImageBuildResult:
    """Build the image of kernel ``name`` unless it is up to date. ``python3``
    is the Python image itself."""
    console = console or Console(stderr=True)
    if name == DEFAULT_KERNEL:
        return build_image(tag=tag or python_image, force=force, console=console)
    tag = tag or profile(name).image
    ctx = read_language_context(name, directory)

    def fill(
        client: docker.DockerClient, context: Path, labels: dict[str, str], root: Path, timings: Timings
    ) -> tuple[list[str], list[str]]:
        write_context(ctx, context)
        debs = fetch_debs(client, ctx, python_image, context, root, console, timings)
        return debs, fetch_wheels(ctx, labels, context, root, console, timings)

    return build_committed(
        tag=tag,
        name=name,
        what=f"kernel {name}",
        files={**ctx.files, "\0language-build-format": BUILD_FORMAT},
        python_image=python_image,
        force=force,
        console=console,
        fill=fill,
        labels={"kernelgw.kernel": name},
    )


Timings = list[tuple[str, float]]
Fill = Callable[[docker.DockerClient, Path, dict[str, str], Path, Timings], tuple[list[str], list[str]]]
"""Writes a build's context into the directory given (what ``install.sh`` sees as
``/build``) with its Debian packages and wheels; returns their file names."""


def write_context(ctx: LanguageContext, context: Path) -> None:
    for rel, data in ctx.files.items():
        (context / rel).parent.mkdir(parents=True, exist_ok=True)
        (context / rel).write_bytes(data)


def build_committed(
    *,
    tag: str,
    name: str,
    what: str,
    files: Mapping[str, bytes],
    python_image: str,
    force: bool,
    console: Console,
    fill: Fill,
    labels: dict[str, str],
) -> ImageBuildResult:
    """Build ``tag`` on the Python image by ``install.sh`` in a network-less
    container of it (the context ``fill`` writes), unless an image of that tag
    carries the hash of ``files`` and the Python image already; ``labels`` go on
    it besides the build's own."""
    t_start = time.monotonic()
    timings: Timings = []
    base = build_image(tag=python_image, console=console)
    build_hash = compute_build_hash(files, base.image_id)
    client = connect()
    try:
        with build_lock():
            existing = get_image(client, tag)
            if existing is not None and not force and (existing.labels or {}).get(HASH_LABEL) == build_hash:
                say(console, f"{tag} is up to date ({existing.short_id}, on {python_image})")
                return ImageBuildResult(tag, id_of(existing), False, python_image, time.monotonic() - t_start)
            say(console, f"building {tag} ({what}) on {python_image}")
            python = get_image(client, python_image)
            python_labels = (python.labels or {}) if python is not None else {}
            root = cache_dir()
            root.mkdir(parents=True, exist_ok=True)
            context = Path(tempfile.mkdtemp(prefix=f"build-{name}-", dir=root))
            try:
                debs, wheels = fill(client, context, python_labels, root, timings)
                t0 = time.monotonic()
                image_id = install_and_commit(
                    client,
                    python_image,
                    context,
                    tag=tag,
                    labels={
                        HASH_LABEL: build_hash,
                        "kernelgw.image": name,
                        **labels,
                        "kernelgw.base": python_image,
                        "kernelgw.base-id": base.image_id,
                        "kernelgw.debs": json.dumps(sorted({d.split("_", 1)[0] for d in debs}), separators=(",", ":")),
                        "kernelgw.packages": json.dumps(packages_from_wheels(wheels), separators=(",", ":")),
                    },
                    console=console,
                )
                timings.append(("install", time.monotonic() - t0))
                if existing is not None and id_of(existing) != image_id:
                    remove_quietly(client, id_of(existing))  # the tag moved on; used by a container: kept
            finally:
                shutil.rmtree(context, ignore_errors=True)
            seconds = time.monotonic() - t_start
            say(console, f"built {tag} ({image_id[7:19]}) in {seconds:.0f} s")
            return ImageBuildResult(tag, image_id, True, python_image, seconds, tuple(timings))
    finally:
        client.close()


def fetch_debs(
    client: docker.DockerClient,
    ctx: LanguageContext,
    python_image: str,
    context: Path,
    root: Path,
    console: Console,
    timings: list[tuple[str, float]],
) -> list[str]:
    if "debs.txt" not in ctx.files:
        return []
    packages = read_package_list(context / "debs.txt")
    t0 = time.monotonic()
    with console.status(f"downloading Debian packages for {ctx.name}: {' '.join(packages)} ..."):
        status = image_dpkg_status(client, python_image, context / "dpkg-status")
        debs = download_debs(packages, status, context / "debs", root / "debs")
        (context / "dpkg-status").unlink()
    dt = time.monotonic() - t0
    timings.append(("debs", dt))
    size = sum((context / "debs" / d).stat().st_size for d in debs)
    say(console, f"{len(debs)} Debian packages ({size / 1e6:.0f} MB) ready in {dt:.1f} s")
    return debs


def fetch_wheels(
    ctx: LanguageContext,
    labels: dict[str, str],
    context: Path,
    root: Path,
    console: Console,
    timings: list[tuple[str, float]],
) -> list[str]:
    (context / "wheels").mkdir(exist_ok=True)
    if "requirements.txt" not in ctx.files:
        return []
    pyver, machine = labels.get("kernelgw.python"), labels.get("kernelgw.machine")
    glibc = labels.get("kernelgw.glibc", "")
    if not pyver or not machine or "." not in glibc:
        raise ImageBuildError("The Python kernel image lacks its kernelgw.python/machine/glibc labels; rebuild it.")
    major, minor = (int(x) for x in glibc.split(".")[:2])
    t0 = time.monotonic()
    with console.status(f"downloading wheels for {ctx.name} (Python {pyver}, {machine}) ..."):
        wheels = download_wheels(
            context / "requirements.txt",
            context / "wheels",
            python_version=pyver,
            platforms=manylinux_platforms(machine, (major, minor)),
            wheel_cache=root / "wheels" / f"{pyver}-{machine}",
        )
    dt = time.monotonic() - t0
    timings.append(("wheels", dt))
    say(console, f"{len(wheels)} wheels ready in {dt:.1f} s")
    return wheels


def install_and_commit(
    client: docker.DockerClient,
    python_image: str,
    context: Path,
    *,
    tag: str,
    labels: dict[str, str],
    console: Console,
) -> str:
    """Run install.sh in a network-less container, show its log, commit it as ``tag``."""
    tail: deque[str] = deque(maxlen=LOG_TAIL_LINES)
    # The context is copied in, not bind-mounted: a commit records a mount point
    # as a VOLUME of the image, and every kernel container would then get an
    # anonymous volume there (left behind on the engine when it is removed).
    container = client.containers.create(
        python_image,
        command=["sh", "-euc", "sh -eu /build/install.sh && rm -rf /build"],
        user="0:0",
        working_dir="/",
        network_mode="none",
        environment={"DEBIAN_FRONTEND": "noninteractive"},
        labels={"kernelgw.stage": "install"},
    )
    try:
        with tempfile.TemporaryFile(dir=context.parent) as archive:
            with tarfile.open(fileobj=archive, mode="w") as tar:
                tar.add(str(context), arcname="build")
            archive.seek(0)
            container.put_archive("/", archive)
        container.start()
        progress = spinner(console)
        with progress:
            task = progress.add_task(f"install.sh for {tag}", total=None)
            pending = b""
            for chunk in container.logs(stream=True, follow=True):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for raw in lines:
                    line = raw.decode(errors="replace").rstrip()
                    if line:
                        tail.append(line)
                        short = line if len(line) <= 100 else line[:97] + "..."
                        progress.update(task, description=short)
            if pending.strip():
                tail.append(pending.decode(errors="replace").rstrip())
        result = container.wait(timeout=INSTALL_TIMEOUT_S)
        code = result.get("StatusCode", -1)
        if code != 0:
            raise ImageBuildError(f"install.sh of {tag} failed (exit {code})", "\n".join(tail))
        repo, _, version = tag.rpartition(":")
        if not repo or "/" in version:
            repo, version = tag, "latest"
        changes = [*COMMIT_CHANGES, *(f"LABEL {k}={json.dumps(v)}" for k, v in labels.items())]
        image = container.commit(repository=repo, tag=version, changes=changes)
        return id_of(image)
    except docker.errors.APIError as exc:
        raise ImageBuildError(f"building {tag} failed: {exc}", "\n".join(tail)) from exc
    finally:
        try:
            container.remove(force=True, v=True)
        except docker.errors.APIError:
            pass


def remove_quietly(client: docker.DockerClient, image_id: str) -> None:
    try:
        client.images.remove(image_id)
    except docker.errors.APIError:
        pass
