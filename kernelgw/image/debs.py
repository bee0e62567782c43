"""Debian packages for a kernel image, downloaded on the host.

The image build has no network, so the host's apt resolves and downloads what
an image lacks: it reads the image's own dpkg status (what is installed there,
not on the host) and fetches the missing packages with their dependencies into
a cache directory; the build installs the files with ``apt-get install
./*.deb``. The host must run the image's Debian release (bookworm; the
debootstrap base is made from the host's mirror, so they agree).
"""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import docker
import docker.errors

from kernelgw.image.errors import LOG_TAIL_LINES, ImageBuildError

DPKG_STATUS = "/var/lib/dpkg/status"


class DebDownloadError(ImageBuildError):
    """apt on the host could not resolve or download the image's Debian packages."""

    code = "deb_download_failed"


def read_package_list(path: Path) -> list[str]:
    """Package names from a ``debs.txt``: one per line, ``#`` starts a comment."""
    names = []
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            names.extend(line.split())
    return names


def image_dpkg_status(client: docker.DockerClient, image: str, dest: Path) -> Path:
    """Copy ``image``'s dpkg status file to ``dest`` (a created, never started container)."""
    container = client.containers.create(image, command=["true"], network_mode="none")
    try:
        stream, _ = container.get_archive(DPKG_STATUS)
        data = b"".join(stream)
    except docker.errors.APIError as exc:
        raise DebDownloadError(f"could not read {DPKG_STATUS} from {image}: {exc}") from exc
    finally:
        container.remove(force=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        member = tar.extractfile("status")
        if member is None:
            raise DebDownloadError(f"{image} has no {DPKG_STATUS}")
        dest.write_bytes(member.read())
    return dest


# "Inst libfoo1 (1:2.3-4 Debian:12.5/stable [amd64])" in apt-get's simulation
_INST = re.compile(r"^Inst (\S+) (?:\[[^\]]*\] )?\((\S+) .*\[(\S+)\]\)")


def planned_debs(simulation: str) -> list[str]:
    """The .deb file names apt would fetch, from ``apt-get -s install``'s output."""
    names = []
    for line in simulation.splitlines():
        m = _INST.match(line)
        if m:
            package, version, arch = m.groups()
            names.append(f"{package}_{version.replace(':', '%3a')}_{arch}.deb")
    return names


def _apt(args: list[str], status: Path, archives: Path) -> subprocess.CompletedProcess[str]:
    options = [
        f"-oDir::State::status={status}",
        f"-oDir::Cache::archives={archives}",
        "-oDir::Cache::pkgcache=",
        "-oDir::Cache::srcpkgcache=",
        "-oDebug::NoLocking=1",
        "-oAPT::Install-Recommends=false",
    ]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    return subprocess.run(
        ["apt-get", "-y", *options, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )


def download_debs(packages: list[str], status: Path, dest: Path, cache: Path) -> list[str]:
    """Download ``packages`` and what they need beyond ``status`` into ``dest``
    (hard links into ``cache``, which keeps every file for the next build).
    Returns the file names."""
    if not packages:
        return []
    if shutil.which("apt-get") is None:
        raise DebDownloadError(
            "This kernel's image needs Debian packages, and this host has no apt-get to download them. "
            "Build it on a Debian bookworm host."
        )
    (cache / "partial").mkdir(parents=True, exist_ok=True)
    dest.mkdir(parents=True, exist_ok=True)
    sim = _apt(["-s", "install", *packages], status, cache)
    if sim.returncode != 0:
        # lists missing or stale on a fresh host: refresh once
        update = subprocess.run(["apt-get", "update"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        sim = _apt(["-s", "install", *packages], status, cache)
        if sim.returncode != 0:
            tail = "\n".join((update.stdout + sim.stdout).splitlines()[-LOG_TAIL_LINES:])
            raise DebDownloadError(f"apt cannot resolve {' '.join(packages)} for the image", tail)
    wanted = planned_debs(sim.stdout)
    if any(not (cache / name).is_file() for name in wanted):
        got = _apt(["--download-only", "install", *packages], status, cache)
        if got.returncode != 0:
            tail = "\n".join(got.stdout.splitlines()[-LOG_TAIL_LINES:])
            raise DebDownloadError(f"apt could not download {' '.join(packages)}", tail)
    missing = [name for name in wanted if not (cache / name).is_file()]
    if missing:
        raise DebDownloadError(f"apt reported these packages but did not download them: {missing}")
    for name in wanted:
        target = dest / name
        try:
            os.link(cache / name, target)
        except OSError:
            shutil.copyfile(cache / name, target)
    return wanted
