"""The offline base image: a ``debootstrap --variant=minbase`` root, ``docker import``-ed.

Used when ``python:3.12-slim`` can neither be found nor pulled; needs root on
the host (debootstrap mounts /proc inside the root it builds) and a Debian
mirror, found from the host's apt configuration.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import docker
from docker.models.images import Image
from rich.console import Console

from kernelgw.image.apt_mirror import DEBOOTSTRAP_SUITE, find_apt_mirror
from kernelgw.image.engine import get_image
from kernelgw.image.errors import LOG_TAIL_LINES, BaseImageError
from kernelgw.image.names import DEBOOTSTRAP_BASE, SLIM_BASE
from kernelgw.image.progress import say

DEBOOTSTRAP_PACKAGES = ("python3", "python3-venv", "tini")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _find_debootstrap() -> str | None:
    return shutil.which("debootstrap") or next(
        (p for p in ("/usr/sbin/debootstrap", "/sbin/debootstrap") if os.access(p, os.X_OK)),
        None,
    )


def _run_logged(cmd: list[str], what: str, **kw: Any) -> str:
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)
    output: str = proc.stdout
    if proc.returncode != 0:
        tail = "\n".join(output.splitlines()[-LOG_TAIL_LINES:])
        raise BaseImageError(f"{what} failed (exit {proc.returncode}): {' '.join(cmd)}", tail)
    return output


def _ensure_debootstrap(console: Console) -> str:
    found = _find_debootstrap()
    if found:
        return found
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise BaseImageError(
            "debootstrap is not installed and cannot be installed automatically "
            "(needs root and apt-get). Install it (`sudo apt-get install debootstrap`) "
            f"or pass base=<an image with python3>, e.g. base={SLIM_BASE!r}."
        )
    say(console, "installing debootstrap with apt-get ...")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    _run_logged(["apt-get", "update"], "apt-get update", env=env)
    _run_logged(["apt-get", "install", "-y", "debootstrap"], "apt-get install debootstrap", env=env)
    found = _find_debootstrap()
    if not found:
        raise BaseImageError("apt-get installed debootstrap but it is not on PATH")
    return found


def _unmount_below(root: Path) -> None:
    """Lazily unmount anything debootstrap left mounted inside ``root``."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return
    prefix = str(root.resolve()).rstrip("/") + "/"
    mounts = [ln.split()[4] for ln in lines if len(ln.split()) > 4]
    for mnt in sorted((m for m in mounts if m.startswith(prefix)), key=len, reverse=True):
        subprocess.run(["umount", "-l", mnt], check=False, capture_output=True)


def _remove_rootfs(root: Path) -> None:
    if not root.exists():
        return
    _unmount_below(root)
    # --one-file-system: never descend into a mount that could not be
    # unmounted (e.g. the host's /proc).
    subprocess.run(["rm", "-rf", "--one-file-system", str(root)], check=False)


def _slim_rootfs(root: Path) -> None:
    """Drop apt's caches: they would only make the base image bigger."""
    for pattern in ("var/cache/apt/archives/*.deb", "var/cache/apt/*.bin", "var/lib/apt/lists/*"):
        for p in root.glob(pattern):
            if p.is_file() or p.is_symlink():
                p.unlink()


def build_debootstrap_base(
    client: docker.DockerClient,
    name: str = DEBOOTSTRAP_BASE,
    *,
    suite: str = DEBOOTSTRAP_SUITE,
    mirror: str | None = None,
    console: Console | None = None,
    timings: list[tuple[str, float]] | None = None,
) -> Image:
    """Make ``name`` from a ``debootstrap --variant=minbase`` root file system."""
    console = console or Console(stderr=True)
    if os.geteuid() != 0:
        raise BaseImageError(
            f"Making the base image {name} with debootstrap needs root. Run the build "
            f"as root once, or pass base=<an image with python3>, e.g. base={SLIM_BASE!r}."
        )
    debootstrap = _ensure_debootstrap(console)
    mirror = mirror or find_apt_mirror(suite=suite)
    work_parent = "/var/tmp" if os.path.isdir("/var/tmp") else None
    root = Path(tempfile.mkdtemp(prefix="kernelgw-rootfs-", dir=work_parent))
    try:
        cmd = [
            debootstrap,
            "--variant=minbase",
            "--include=" + ",".join(DEBOOTSTRAP_PACKAGES),
            suite,
            str(root),
            mirror,
        ]
        t0 = time.monotonic()
        with console.status(f"debootstrap {suite} from {mirror} (about a minute) ..."):
            _run_logged(cmd, "debootstrap")
        dt = time.monotonic() - t0
        if timings is not None:
            timings.append(("debootstrap", dt))
        say(console, f"debootstrap done in {dt:.0f} s")
        _slim_rootfs(root)

        t0 = time.monotonic()
        repo, _, tag = name.rpartition(":")
        tar = subprocess.Popen(
            ["tar", "--numeric-owner", "-C", str(root), "-c", "."],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            with console.status(f"docker import {name} ..."):
                assert tar.stdout is not None
                out = client.api.import_image_from_stream(
                    tar.stdout,
                    repository=repo,
                    tag=tag,
                    changes=[f"ENV PATH={DEFAULT_PATH}", "ENV LANG=C.UTF-8", 'CMD ["/bin/bash"]'],
                )
        finally:
            _, tar_err = tar.communicate()
        if tar.returncode != 0:
            raise BaseImageError(f"tar of the debootstrap root failed: {tar_err.decode(errors='replace')}")
        if timings is not None:
            timings.append(("import", time.monotonic() - t0))
        image = get_image(client, name)
        if image is None:
            raise BaseImageError(f"docker import did not produce {name}", str(out)[-2000:])
        say(console, f"made base image {name} ({image.short_id})")
        return image
    finally:
        _remove_rootfs(root)
