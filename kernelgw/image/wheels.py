"""Binary wheels for a kernel image's Python, downloaded on the host with pip.

The sandbox never gets network: the image build and the gateway's session
installs both resolve here, for the image's Python version and manylinux
platforms, with a cache per target that lets an offline host build again.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

from kernelgw.image.errors import LOG_TAIL_LINES, WheelDownloadError


def pip_command() -> list[str]:
    """How to run pip on the host: this interpreter's, else one on PATH."""
    try:
        import pip  # noqa: F401
    except ImportError:
        pip_exe = shutil.which("pip3") or shutil.which("pip")
        if pip_exe is None:
            raise WheelDownloadError("pip is needed on the host to download the wheelhouse") from None
        return [pip_exe]
    return [sys.executable, "-m", "pip"]


def pip_download_command(
    python_version: str, platforms: list[str], dest: Path, find_links: Path, requirements: Path
) -> list[str]:
    """``pip download`` of binary wheels for a kernel image's Python and platforms
    (not the host's), into ``dest``, preferring wheels already in ``find_links``.
    Shared by the image build and by package installs into sessions, which must
    resolve for the same target."""
    return [
        *pip_command(),
        "download",
        "--disable-pip-version-check",
        "--no-input",
        "--progress-bar",
        "off",
        "--only-binary=:all:",
        "--implementation",
        "cp",
        "--python-version",
        python_version,
        *[arg for p in platforms for arg in ("--platform", p)],
        "--dest",
        str(dest),
        "--find-links",
        str(find_links),
        "--requirement",
        str(requirements),
    ]


def manylinux_platforms(machine: str, glibc: tuple[int, int]) -> list[str]:
    """``pip --platform`` tags a glibc ``glibc`` system on ``machine`` can run."""
    major, minor = glibc
    if major != 2:
        raise ValueError(f"unsupported glibc version {major}.{minor}")
    legacy_ok = machine in ("x86_64", "i686")
    lowest = 5 if legacy_ok else 17
    tags = [f"manylinux_2_{m}_{machine}" for m in range(minor, lowest - 1, -1)]
    if minor >= 17:
        tags.append(f"manylinux2014_{machine}")
    if legacy_ok and minor >= 12:
        tags.append(f"manylinux2010_{machine}")
    if legacy_ok and minor >= 5:
        tags.append(f"manylinux1_{machine}")
    return tags


def packages_from_wheels(names: Iterable[str]) -> dict[str, str]:
    """``{"numpy": "2.1.0", ...}`` from wheel file names (PEP 427)."""
    out: dict[str, str] = {}
    for name in names:
        if not name.endswith(".whl"):
            continue
        parts = name[: -len(".whl")].split("-")
        if len(parts) < 5:
            continue
        dist = re.sub(r"[-_.]+", "-", parts[0]).lower()
        out[dist] = parts[1]
    return dict(sorted(out.items()))


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def download_wheels(
    requirements: Path,
    dest: Path,
    *,
    python_version: str,
    platforms: list[str],
    wheel_cache: Path,
) -> list[str]:
    """``pip download`` binary wheels for the target into ``dest``.

    ``wheel_cache`` keeps every wheel ever downloaded for this target; pip
    takes wheels from there instead of the network when the resolution picks
    the same versions, and the download falls back to the cache alone when
    the index cannot be reached. Returns the wheel file names in ``dest``.
    """
    dest.mkdir(parents=True, exist_ok=True)
    wheel_cache.mkdir(parents=True, exist_ok=True)
    base_cmd = pip_download_command(python_version, platforms, dest, wheel_cache, requirements)
    proc = subprocess.run(base_cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        first = proc.stdout
        offline = subprocess.run([*base_cmd, "--no-index"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if offline.returncode != 0:
            tail = "\n".join(first.splitlines()[-LOG_TAIL_LINES:])
            raise WheelDownloadError(
                f"pip download of {requirements.name} for Python {python_version} "
                f"({platforms[0]}) failed, and the local wheel cache {wheel_cache} "
                "does not have everything either.",
                tail,
            )
    names = sorted(p.name for p in dest.glob("*.whl"))
    for name in names:
        cached = wheel_cache / name
        if not cached.exists():
            _link_or_copy(dest / name, cached)
    return names
