"""Offline package installs into sessions.

The sandbox never gets network. A session asks for packages by name; the
gateway

1. refuses anything not on the operator's allowlist (``package_allowlist``;
   names compared as PEP 503 normalised names);
2. resolves the request on the host with ``pip download`` for the image's
   Python and platform (from the image's labels), binary wheels only, pinned
   to the versions the image and the session already have: first from the
   local wheel cache alone (``--no-index``), then, if the operator allows it,
   from the package index with the host's network; new wheels join the cache;
3. sends the wheels the session does not have yet (never the image's own
   packages) into the container as a tar stream through the engine's exec API,
   where ``kernelgw_kernel.pkg`` installs them with pip, offline and without
   dependency resolution, into the session's package tmpfs. That directory is
   on the kernel's ``sys.path`` (after the image's site-packages), and the
   kernel extension drops its cached listing before every cell, so the
   package imports in the next cell without a restart.

Dependencies of an allowlisted package are installed with it without being
on the allowlist themselves: the allowlist names what a session may ask for.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import shutil
import tarfile
import tempfile
import time
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernelgw.allowlist import normalize_name, parse_allowlist
from kernelgw.errors import (
    BadRequest,
    ImageNotFound,
    PackageInstallFailed,
    PackageNotAllowed,
    PackageUnavailable,
    QuotaExceeded,
)
from kernelgw.models import InstallResult, PackageInfo, PresentPackage
from kernelgw.runtime.backends.base import Backend, KernelHandle
from kernelgw.runtime.workspace import PYTHON, HelperAnswer

if TYPE_CHECKING:  # imported where used: a start need not pay for packaging (see kernelgw.allowlist)
    from packaging.requirements import Requirement

log = logging.getLogger(__name__)

PKG_HELPER = [PYTHON, "-I", "-m", "kernelgw_kernel.pkg"]
MAX_PACKAGES_PER_REQUEST = 50
_FRAME = 1 << 20


# ------------------------------------------------------------------ pure rules


def check_request(requested: Sequence[str], allowlist: dict[str, Requirement]) -> list[Requirement]:
    """The requested requirements, or why they are refused (400)."""
    from packaging.requirements import InvalidRequirement, Requirement

    if not requested:
        raise BadRequest('Name at least one package, e.g. {"packages": ["sympy"]}.')
    if len(requested) > MAX_PACKAGES_PER_REQUEST:
        raise BadRequest(f"At most {MAX_PACKAGES_PER_REQUEST} packages per request.")
    if not allowlist:
        raise PackageNotAllowed(
            "This gateway installs no packages: its package allowlist is empty (setting package_allowlist)."
        )
    reqs: list[Requirement] = []
    refused: list[str] = []
    for text in requested:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            raise BadRequest(
                f"{text!r} is not a package requirement; give a name, optionally with a version "
                "specifier, e.g. 'sympy' or 'sympy>=1.12'."
            ) from None
        if req.url or req.marker:
            raise BadRequest(f"{text!r}: URLs and environment markers are not accepted; give a name and version.")
        if normalize_name(req.name) not in allowlist:
            refused.append(req.name)
        reqs.append(req)
    if refused:
        allowed = ", ".join(str(r) for r in allowlist.values())
        raise PackageNotAllowed(
            f"Not on this gateway's package allowlist: {', '.join(refused)}. Allowed: {allowed}. "
            "The operator decides what sessions may install (setting package_allowlist)."
        )
    return reqs


@dataclass(frozen=True)
class ImageTarget:
    """What wheels an image can use, from its labels."""

    python: str
    machine: str
    glibc: tuple[int, int]
    packages: dict[str, str]

    @property
    def platforms(self) -> list[str]:
        from kernelgw.image import manylinux_platforms

        return manylinux_platforms(self.machine, self.glibc)

    @property
    def cache_key(self) -> str:
        return f"{self.python}-{self.machine}"


_ARCH = {"amd64": "x86_64", "arm64": "aarch64", "386": "i686", "ppc64le": "ppc64le", "s390x": "s390x"}


def image_target(labels: dict[str, str]) -> ImageTarget | None:
    """The target of a kernelgw image, or None for an image without its labels.
    Images built before the machine/glibc labels existed fall back to x86_64 and
    glibc 2.17 (manylinux2014), which every supported image satisfies."""
    import json

    python = labels.get("kernelgw.python")
    if not python:
        return None
    machine = labels.get("kernelgw.machine") or "x86_64"
    glibc = (2, 17)
    if m := re.fullmatch(r"(\d+)\.(\d+)", labels.get("kernelgw.glibc", "")):
        glibc = (int(m.group(1)), int(m.group(2)))
    try:
        packages = {normalize_name(k): str(v) for k, v in json.loads(labels.get("kernelgw.packages", "{}")).items()}
    except (ValueError, AttributeError):
        packages = {}
    return ImageTarget(python, machine, glibc, packages)


def wheel_name_version(filename: str) -> tuple[str, str]:
    parts = filename[: -len(".whl")].split("-")
    return normalize_name(parts[0]), parts[1]


def pip_failure(output: str, requested: Sequence[Requirement]) -> str:
    """A short reason from pip's output."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("ERROR:")]
    for line in errors:
        m = re.search(r"No matching distribution found for (\S+)", line)
        if m:
            return (
                f"No wheel of {m.group(1)} fits this image (binary or pure-Python wheels only; the "
                "sandbox cannot build from source), or it does not exist."
            )
    if any("ResolutionImpossible" in ln or "conflict" in ln.lower() for ln in lines):
        tail = " ".join(lines[-6:])
        return (
            "The request conflicts with the versions the image (or the session) already has, which "
            f"cannot be replaced. pip: {tail[:800]}"
        )
    tail = " | ".join(errors[-3:] or lines[-3:])
    return f"pip could not resolve {', '.join(str(r) for r in requested)}: {tail[:800]}"


# ------------------------------------------------------------------ installer


class PackageInstaller:
    def __init__(
        self,
        backend: Backend,
        *,
        allowlist: Iterable[str],
        wheel_cache_dir: Path | None,
        allow_download: bool,
        timeout: float,
    ) -> None:
        self.backend = backend
        self.allowlist = parse_allowlist(allowlist)
        self.wheel_cache_dir = wheel_cache_dir
        self.allow_download = allow_download
        self.timeout = timeout
        self._resolve_lock = asyncio.Lock()
        self._session_locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    def cache_dir(self, target: ImageTarget) -> Path:
        from kernelgw.image import cache_dir

        root = self.wheel_cache_dir or cache_dir() / "wheels"
        return root / target.cache_key

    async def target(self, image: str) -> ImageTarget:
        labels = await self.backend.image_labels(image)
        if labels is None:
            raise ImageNotFound(f"Kernel image {image!r} is not present. Build it with `kernelgw image build`.")
        target = image_target(labels)
        if target is None:
            raise PackageUnavailable(
                f"Image {image!r} has no kernelgw.python label, so the gateway cannot tell which wheels fit "
                "it; build it with `kernelgw image build`."
            )
        return target

    async def session_packages(self, handle: KernelHandle) -> dict[str, str]:
        """What the session installed earlier: normalised name -> version."""
        answer = await self._helper(handle, ["list"], stdin=False)
        return {normalize_name(k): str(v) for k, v in (answer.get("packages") or {}).items()}

    async def install(self, handle: KernelHandle, image: str, requested: Sequence[str]) -> InstallResult:
        """Install ``requested`` into the session's container; one install per
        session at a time (pip --target is not safe to run twice at once)."""
        t0 = time.monotonic()
        reqs = check_request(requested, self.allowlist)
        lock = self._session_locks.get(handle.container_id)
        if lock is None:
            lock = self._session_locks[handle.container_id] = asyncio.Lock()
        async with lock:
            return await self._install(handle, image, reqs, t0)

    async def _install(self, handle: KernelHandle, image: str, reqs: list[Requirement], t0: float) -> InstallResult:
        target = await self.target(image)
        have = await self.session_packages(handle)

        present: list[PresentPackage] = []
        todo: list[Requirement] = []
        for req in reqs:
            name = normalize_name(req.name)
            for source, versions in (("image", target.packages), ("session", have)):
                version = versions.get(name)
                if version is None:
                    continue
                if req.specifier.contains(version, prereleases=True):
                    present.append(PresentPackage(name=name, version=version, source=source))
                    break
                if source == "image":
                    raise PackageUnavailable(
                        f"{req} cannot be installed: the image has {name} {version} preinstalled, and "
                        "preinstalled packages are not replaced."
                    )
            else:
                todo.append(req)
        if not todo:
            return InstallResult(installed=[], already_present=present, duration_ms=_ms(t0))

        # pin what the kernel already imports: the image's packages, then the session's
        pins = {**have, **target.packages}
        with tempfile.TemporaryDirectory(prefix="kernelgw-resolve-") as tmp:
            dest = Path(tmp) / "wheels"
            wheels = await self._resolve(todo, pins, target, Path(tmp), dest)
            needed = [
                w
                for w in wheels
                if wheel_name_version(w.name)[0] not in target.packages
                and have.get(wheel_name_version(w.name)[0]) != wheel_name_version(w.name)[1]
            ]
            answer = await self._send_and_install(handle, needed)
        installed = [
            PackageInfo(name=normalize_name(p["name"]), version=str(p["version"])) for p in answer.get("installed", [])
        ]
        return InstallResult(installed=installed, already_present=present, duration_ms=_ms(t0))

    # --- host side

    async def _resolve(
        self, reqs: list[Requirement], pins: dict[str, str], target: ImageTarget, tmp: Path, dest: Path
    ) -> list[Path]:
        """``pip download`` the requirements for the image into ``dest``; the
        wheels there afterwards are exactly the resolved set."""
        cache = self.cache_dir(target)
        cache.mkdir(parents=True, exist_ok=True)
        (tmp / "requirements.txt").write_text("".join(f"{r}\n" for r in reqs))
        # constraints may not name extras; the image's names are plain anyway
        (tmp / "constraints.txt").write_text("".join(f"{n}=={v}\n" for n, v in sorted(pins.items())))
        from kernelgw.image import pip_download_command

        base = [
            *pip_download_command(target.python, list(target.platforms), dest, cache, tmp / "requirements.txt"),
            "--constraint",
            str(tmp / "constraints.txt"),
        ]
        async with self._resolve_lock:
            code, output = await _run([*base, "--no-index"], self.timeout)
            if code != 0 and self.allow_download:
                shutil.rmtree(dest, ignore_errors=True)
                log.info("wheel cache %s lacks %s; downloading", cache, ", ".join(map(str, reqs)))
                code, output = await _run(base, self.timeout)
            if code != 0:
                reason = pip_failure(output, reqs)
                if not self.allow_download:
                    reason += f" (the gateway installs offline from its wheel cache {cache} only)"
                raise PackageUnavailable(reason)
            # listing and linking touch the disk: off the event loop
            return await asyncio.to_thread(_keep_in_cache, dest, cache)

    # --- container side

    async def _helper(
        self, handle: KernelHandle, args: list[str], *, stdin: bool, payload: list[Path] | None = None
    ) -> dict[str, Any]:
        proc = await self.backend.exec(handle, [*PKG_HELPER, *args], stdin=stdin, timeout=self.timeout)
        try:
            if payload is not None:
                await self._send_tar(proc, payload)
            answer = await HelperAnswer(proc).line()
        finally:
            await proc.close()
        if answer.get("ok") is True:
            return answer
        code, message = str(answer.get("error")), str(answer.get("message", ""))
        if code == "no_space":
            raise QuotaExceeded(
                f"The session's package directory is full (setting packages_size_mb). pip: {message[-500:]}"
            )
        raise PackageInstallFailed(f"Installing into the session failed: {message[-1500:]}")

    async def _send_tar(self, proc: Any, wheels: list[Path]) -> None:
        """A ustar/pax stream of the wheels, framed (4-byte length + data, zero
        length ends), written as it is read: at most 1 MiB of it in memory."""

        async def send(data: bytes) -> None:
            if data:
                await proc.write(len(data).to_bytes(4, "big") + data)

        for wheel in wheels:
            info = tarfile.TarInfo(wheel.name)
            info.size = wheel.stat().st_size
            info.mode = 0o644
            info.mtime = int(time.time())
            await send(info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape"))
            with wheel.open("rb") as f:
                while chunk := await asyncio.to_thread(f.read, _FRAME):
                    await send(chunk)
            await send(b"\0" * (-info.size % tarfile.BLOCKSIZE))
        await send(b"\0" * (2 * tarfile.BLOCKSIZE))  # end of archive
        await proc.write(b"\0\0\0\0")

    async def _send_and_install(self, handle: KernelHandle, wheels: list[Path]) -> dict[str, Any]:
        if not wheels:
            return {"installed": []}
        return await self._helper(handle, ["install"], stdin=True, payload=wheels)


async def _run(cmd: list[str], timeout: float) -> tuple[int, str]:
    """Run ``cmd`` without blocking the event loop; (exit code, combined output)."""
    proc = await asyncio.create_subprocess_exec(
        *cmd, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    try:
        async with asyncio.timeout(timeout):
            out, _ = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return 1, f"ERROR: pip did not finish within {timeout:g}s"
    return proc.returncode or 0, out.decode("utf-8", "replace")


def _ms(t0: float) -> float:
    return round((time.monotonic() - t0) * 1000, 1)


def _keep_in_cache(dest: Path, cache: Path) -> list[Path]:
    """The wheels pip put in ``dest``, each also kept in the wheel cache (hard link
    when the cache is on the same file system)."""
    wheels = sorted(dest.glob("*.whl"))
    for wheel in wheels:
        cached = cache / wheel.name
        if not cached.exists():
            try:
                os.link(wheel, cached)
            except OSError:
                shutil.copy2(wheel, cached)
    return wheels
