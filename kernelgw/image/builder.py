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
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import docker
import docker.errors
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from kernelgw.errors import EngineUnavailable, KernelGWError

__all__ = [
    "DEBOOTSTRAP_BASE",
    "DEFAULT_TAG",
    "SLIM_BASE",
    "BaseImageError",
    "ImageBuildError",
    "ImageBuildResult",
    "WheelDownloadError",
    "build_image",
    "image_exists",
]

DEFAULT_TAG = "kernelgw/python:latest"
SLIM_BASE = "python:3.12-slim"
DEBOOTSTRAP_BASE = "kernelgw/base:bookworm"
DEBOOTSTRAP_SUITE = "bookworm"
DEBOOTSTRAP_PACKAGES = ("python3", "python3-venv", "tini")
DEFAULT_MIRROR = "http://deb.debian.org/debian"

HASH_LABEL = "kernelgw.build-hash"
STAGE_LABEL = "kernelgw.stage"
# Bump when the way the image is built changes in a way the hashed files do
# not show (e.g. the wheel download options), to force one rebuild.
BUILD_FORMAT = "1"
CONTEXT_FILES = (
    "Dockerfile",
    "requirements.txt",
    "start-kernel",
    "kernelgw_kernel/__init__.py",
    "kernelgw_kernel/fs.py",
    "kernelgw_kernel/pkg.py",
    "kernelgw_kernel/launcher.py",
)
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

_LOG_TAIL_LINES = 40
_BUILD_TIMEOUT = 3600  # seconds the Docker API may stay silent during a build


# --------------------------------------------------------------------------
# Errors and result


class ImageBuildError(KernelGWError):
    """Building the kernel image failed; ``log_tail`` holds the last lines."""

    code = "image_build_failed"

    def __init__(self, message: str, log_tail: str = "") -> None:
        full = message
        if log_tail:
            full = f"{message}\n--- last lines of the log ---\n{log_tail.rstrip()}"
        super().__init__(full)
        self.log_tail = log_tail


class BaseImageError(ImageBuildError):
    """The base image could not be found, pulled or made with debootstrap."""

    code = "base_image_failed"


class WheelDownloadError(ImageBuildError):
    """``pip download`` of the wheelhouse failed."""

    code = "wheel_download_failed"


@dataclasses.dataclass(frozen=True)
class ImageBuildResult:
    tag: str
    image_id: str
    built: bool  # False when the image was already up to date (no-op)
    base: str
    seconds: float
    # (phase, seconds) pairs, e.g. ("debootstrap", 38.2), ("wheels", 4.1)
    timings: tuple[tuple[str, float], ...] = ()


# --------------------------------------------------------------------------
# Pure helpers (unit-tested without Docker)


def _deb822_stanzas(text: str) -> Iterator[dict[str, str]]:
    stanza: dict[str, str] = {}
    key: str | None = None
    for raw in text.splitlines():
        line = raw.rstrip()
        if line.lstrip().startswith("#"):
            continue
        if not line.strip():
            if stanza:
                yield stanza
            stanza, key = {}, None
            continue
        if line[0] in " \t" and key is not None:
            stanza[key] += " " + line.strip()
            continue
        name, sep, value = line.partition(":")
        if not sep:
            continue
        key = name.strip().lower()
        stanza[key] = value.strip()
    if stanza:
        yield stanza


def _usable_uri(uri: str) -> bool:
    return uri.split(":", 1)[0] in ("http", "https", "ftp", "file")


def _pick_mirror(entries: Iterable[tuple[str, list[str]]], suite: str) -> str | None:
    """Prefer an entry serving ``suite``, then any URI ending in /debian."""
    candidates = [
        (uri, suites)
        for uri, suites in entries
        if _usable_uri(uri) and not uri.rstrip("/").endswith("-security") and not any("security" in s for s in suites)
    ]
    for uri, suites in candidates:
        if suite in suites:
            return uri.rstrip("/")
    for uri, _ in candidates:
        if uri.rstrip("/").endswith("/debian"):
            return uri.rstrip("/")
    return None


def parse_deb822_mirror(text: str, suite: str = DEBOOTSTRAP_SUITE) -> str | None:
    """The Debian mirror of a deb822 ``*.sources`` file, or None."""
    entries = []
    for st in _deb822_stanzas(text):
        if "deb" not in st.get("types", "").split():
            continue
        if st.get("enabled", "yes").lower() == "no":
            continue
        suites = st.get("suites", "").split()
        entries.extend((uri, suites) for uri in st.get("uris", "").split())
    return _pick_mirror(entries, suite)


def parse_sources_list_mirror(text: str, suite: str = DEBOOTSTRAP_SUITE) -> str | None:
    """The Debian mirror of a one-line-style ``sources.list``, or None."""
    entries = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        line = re.sub(r"\[[^\]]*\]", " ", line)  # [arch=amd64 signed-by=...]
        parts = line.split()
        if len(parts) < 3 or parts[0] != "deb":
            continue
        entries.append((parts[1], [parts[2]]))
    return _pick_mirror(entries, suite)


def find_apt_mirror(apt_dir: Path = Path("/etc/apt"), suite: str = DEBOOTSTRAP_SUITE) -> str:
    """The mirror apt is configured with, or :data:`DEFAULT_MIRROR`."""
    sources_d = apt_dir / "sources.list.d"
    files: list[tuple[Path, bool]] = []
    if sources_d.is_dir():
        files += [(p, True) for p in sorted(sources_d.glob("*.sources"))]
    files.append((apt_dir / "sources.list", False))
    if sources_d.is_dir():
        files += [(p, False) for p in sorted(sources_d.glob("*.list"))]
    for path, deb822 in files:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        mirror = (parse_deb822_mirror if deb822 else parse_sources_list_mirror)(text, suite)
        if mirror:
            return mirror
    return DEFAULT_MIRROR


def compute_build_hash(files: Mapping[str, bytes], base_image_id: str) -> str:
    """Content hash of the build inputs; goes into the ``kernelgw.build-hash`` label."""
    h = hashlib.sha256()
    h.update(f"kernelgw-image-build:{BUILD_FORMAT}\n".encode())
    for name in sorted(files):
        data = files[name]
        h.update(f"{name}\0{len(data)}\0".encode())
        h.update(data)
    h.update(f"base\0{base_image_id}\n".encode())
    return h.hexdigest()


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


def parse_step(line: str) -> str | None:
    """``"Step 3/12 : RUN ..."`` from a legacy-builder log line, else None."""
    m = re.match(r"\s*(Step \d+/\d+ : .*)", line)
    return m.group(1).strip() if m else None


def default_image_dir() -> Path:
    """``images/python`` of the source tree (override: ``KERNELGW_IMAGE_DIR``)."""
    env = os.environ.get("KERNELGW_IMAGE_DIR")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "images" / "python"


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kernelgw"


# --------------------------------------------------------------------------
# Docker helpers


def _client() -> docker.DockerClient:
    try:
        client = docker.from_env(timeout=120)
        client.ping()
    except docker.errors.DockerException as exc:
        raise EngineUnavailable(
            f"The Docker engine is not answering ({exc}). Start it (scripts/ensure-docker.sh does) and try again."
        ) from exc
    return client


def _get_image(client: docker.DockerClient, name: str) -> Any | None:
    try:
        return client.images.get(name)
    except docker.errors.ImageNotFound:
        return None


def image_exists(tag: str = DEFAULT_TAG) -> bool:
    """True when the Docker engine has an image called ``tag``."""
    client = _client()
    try:
        return _get_image(client, tag) is not None
    finally:
        client.close()


def _say(console: Console, msg: str) -> None:
    console.print(f"[bold cyan]kernelgw image[/]: {msg}", highlight=False)


@contextlib.contextmanager
def _build_lock() -> Iterator[None]:
    """Serialise builds on this machine (tests and the CLI may race)."""
    path = cache_dir() / "build.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


# --------------------------------------------------------------------------
# Base image


def _try_pull(client: docker.DockerClient, name: str, console: Console) -> Any | None:
    repo, _, tag = name.rpartition(":") if ":" in name.split("/")[-1] else (name, "", "latest")
    _say(console, f"pulling {name} ...")
    try:
        return client.images.pull(repo, tag=tag or "latest")
    except docker.errors.APIError as exc:
        reason = str(getattr(exc, "explanation", None) or exc).splitlines()[0][:200]
        _say(console, f"[yellow]cannot pull {name}[/]: {reason}")
        return None


def _find_debootstrap() -> str | None:
    return shutil.which("debootstrap") or next(
        (p for p in ("/usr/sbin/debootstrap", "/sbin/debootstrap") if os.access(p, os.X_OK)),
        None,
    )


def _run_logged(cmd: list[str], what: str, **kw: Any) -> str:
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)
    if proc.returncode != 0:
        tail = "\n".join(proc.stdout.splitlines()[-_LOG_TAIL_LINES:])
        raise BaseImageError(f"{what} failed (exit {proc.returncode}): {' '.join(cmd)}", tail)
    return proc.stdout


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
    _say(console, "installing debootstrap with apt-get ...")
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
) -> Any:
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
        _say(console, f"debootstrap done in {dt:.0f} s")
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
        image = _get_image(client, name)
        if image is None:
            raise BaseImageError(f"docker import did not produce {name}", str(out)[-2000:])
        _say(console, f"made base image {name} ({image.short_id})")
        return image
    finally:
        _remove_rootfs(root)


def resolve_base(
    client: docker.DockerClient,
    base: str,
    console: Console,
    timings: list[tuple[str, float]] | None = None,
) -> tuple[str, Any]:
    """(name, image) of the base image to build on; see the module docstring."""
    if base == "auto":
        image = _get_image(client, SLIM_BASE) or _try_pull(client, SLIM_BASE, console)
        if image is not None:
            return SLIM_BASE, image
        base = "debootstrap"
    if base == "debootstrap":
        image = _get_image(client, DEBOOTSTRAP_BASE)
        if image is None:
            _say(console, f"no {DEBOOTSTRAP_BASE} yet; making it with debootstrap")
            image = build_debootstrap_base(client, DEBOOTSTRAP_BASE, console=console, timings=timings)
        return DEBOOTSTRAP_BASE, image
    image = _get_image(client, base) or _try_pull(client, base, console)
    if image is None:
        raise BaseImageError(
            f"Base image {base!r} is neither present locally nor pullable. "
            "Use base='auto' or base='debootstrap' to build an offline base."
        )
    return base, image


_PROBE = (
    "import json, platform, sys; "
    "print(json.dumps({'python': '%d.%d' % sys.version_info[:2], "
    "'machine': platform.machine(), 'libc': platform.libc_ver()}))"
)


def probe_base(client: docker.DockerClient, base: str) -> dict[str, Any]:
    """Python version, machine and libc of ``base`` (runs it, no network)."""
    try:
        out = client.containers.run(base, ["python3", "-c", _PROBE], remove=True, network_mode="none", stderr=True)
    except (docker.errors.ContainerError, docker.errors.APIError) as exc:
        raise BaseImageError(f"Could not run python3 in the base image {base!r}: {exc}") from exc
    text = out.decode(errors="replace").strip().splitlines()
    try:
        info = json.loads(text[-1])
    except (IndexError, ValueError) as exc:
        raise BaseImageError(f"Unexpected answer from python3 in {base!r}: {text!r}") from exc
    libc_name, libc_version = info["libc"]
    if libc_name != "glibc":
        raise BaseImageError(f"Base image {base!r} does not use glibc ({info['libc']}); unsupported.")
    major, minor = (int(x) for x in libc_version.split(".")[:2])
    info["glibc"] = (major, minor)
    return info


# --------------------------------------------------------------------------
# Wheelhouse


def _pip_command() -> list[str]:
    try:
        import pip  # noqa: F401
    except ImportError:
        pip_exe = shutil.which("pip3") or shutil.which("pip")
        if pip_exe is None:
            raise WheelDownloadError("pip is needed on the host to download the wheelhouse") from None
        return [pip_exe]
    return [sys.executable, "-m", "pip"]


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
    base_cmd = [
        *_pip_command(),
        "download",
        "--disable-pip-version-check",
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
        str(wheel_cache),
        "--requirement",
        str(requirements),
    ]
    proc = subprocess.run(base_cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        first = proc.stdout
        offline = subprocess.run([*base_cmd, "--no-index"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if offline.returncode != 0:
            tail = "\n".join(first.splitlines()[-_LOG_TAIL_LINES:])
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


# --------------------------------------------------------------------------
# Build


def _read_context_files(image_dir: Path) -> dict[str, bytes]:
    files = {}
    for name in CONTEXT_FILES:
        path = image_dir / name
        try:
            files[name] = path.read_bytes()
        except OSError as exc:
            raise ImageBuildError(
                f"Missing build input {path} ({exc.strerror}). Set KERNELGW_IMAGE_DIR to "
                "the images/python directory of a kernelgw source tree."
            ) from exc
    return files


def _stream_build(
    client: docker.DockerClient,
    context: Path,
    *,
    tag: str,
    buildargs: dict[str, str],
    labels: dict[str, str],
    console: Console,
) -> tuple[str, set[str]]:
    """Run the build, showing progress; returns (image id, layer ids seen)."""
    tail: deque[str] = deque(maxlen=_LOG_TAIL_LINES)
    seen_ids: set[str] = set()
    image_id: str | None = None
    error: str | None = None
    progress = Progress(
        SpinnerColumn(),
        TextColumn("[progress.description]{task.description}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
    with progress:
        task = progress.add_task(f"docker build {tag}", total=None)
        try:
            stream = client.api.build(
                path=str(context),
                tag=tag,
                buildargs=buildargs,
                labels=labels,
                network_mode="none",
                rm=True,
                forcerm=True,
                pull=False,
                decode=True,
                timeout=_BUILD_TIMEOUT,
            )
            for chunk in stream:
                if "error" in chunk or "errorDetail" in chunk:
                    error = chunk.get("error") or chunk["errorDetail"].get("message", str(chunk))
                    tail.append(error)
                    continue
                aux = chunk.get("aux")
                if isinstance(aux, dict) and aux.get("ID"):
                    image_id = aux["ID"]
                text = chunk.get("stream")
                if not text:
                    continue
                for line in text.splitlines():
                    if not line.strip():
                        continue
                    tail.append(line)
                    step = parse_step(line)
                    if step:
                        short = step if len(step) <= 100 else step[:97] + "..."
                        progress.update(task, description=short)
                        console.print(f"[dim]{short}[/]", highlight=False, no_wrap=True, overflow="ellipsis")
                    m = re.match(r"\s*(?:--->|Successfully built)\s+([0-9a-f]{12,64})\s*$", line)
                    if m:
                        seen_ids.add(m.group(1))
        except docker.errors.APIError as exc:
            raise ImageBuildError(f"docker build of {tag} failed: {exc}", "\n".join(tail)) from exc
    if error:
        raise ImageBuildError(f"docker build of {tag} failed: {error.strip()}", "\n".join(tail))
    if image_id is None:
        image = _get_image(client, tag)
        if image is None:
            raise ImageBuildError(f"docker build of {tag} produced no image", "\n".join(tail))
        image_id = image.id
    return image_id, seen_ids


def _cleanup_after_build(client: docker.DockerClient, new_id: str, seen_ids: set[str]) -> None:
    """Remove leftovers of earlier builds: untagged first-stage images and
    untagged kernel images (what ``tag`` pointed at before). Images still
    used by a container, and this build's own layers (its cache), stay."""
    stale: set[str] = set()
    for label in (f"{STAGE_LABEL}=build", "kernelgw.image=python"):
        try:
            found = client.images.list(filters={"dangling": True, "label": label})
        except docker.errors.APIError:
            continue
        for img in found:
            short = img.id.split(":", 1)[-1]
            if img.id != new_id and not any(short.startswith(s) for s in seen_ids):
                stale.add(img.id)
    for image_id in stale:
        with contextlib.suppress(docker.errors.APIError):
            client.images.remove(image_id)


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
    files = _read_context_files(image_dir)
    timings: list[tuple[str, float]] = []
    client = _client()
    try:
        with _build_lock():
            existing = _get_image(client, tag)
            if existing is not None and not force:
                labels = existing.labels or {}
                # base="auto" accepts either automatic base; when the image was
                # built on one that is still here, don't try a pull just to
                # find out that nothing changed.
                candidates = {"auto": (SLIM_BASE, DEBOOTSTRAP_BASE), "debootstrap": (DEBOOTSTRAP_BASE,)}
                previous = labels.get("kernelgw.base")
                if previous in candidates.get(base, (base,)):
                    prev_image = _get_image(client, previous)
                    if prev_image is not None and labels.get(HASH_LABEL) == compute_build_hash(files, prev_image.id):
                        seconds = time.monotonic() - t_start
                        _say(console, f"{tag} is up to date ({existing.short_id}, base {previous})")
                        return ImageBuildResult(tag, existing.id, False, previous, seconds)

            base_name, base_image = resolve_base(client, base, console, timings)
            build_hash = compute_build_hash(files, base_image.id)
            if existing is not None and not force and (existing.labels or {}).get(HASH_LABEL) == build_hash:
                seconds = time.monotonic() - t_start
                _say(console, f"{tag} is up to date ({existing.short_id}, base {base_name})")
                return ImageBuildResult(tag, existing.id, False, base_name, seconds, tuple(timings))

            info = probe_base(client, base_name)
            pyver, machine = info["python"], info["machine"]
            _say(
                console,
                f"building {tag} on {base_name} (Python {pyver}, {machine}, "
                f"glibc {info['glibc'][0]}.{info['glibc'][1]})",
            )
            root = cache_dir()
            root.mkdir(parents=True, exist_ok=True)
            context = Path(tempfile.mkdtemp(prefix="build-", dir=root))
            try:
                for name, data in files.items():
                    (context / name).parent.mkdir(parents=True, exist_ok=True)
                    (context / name).write_bytes(data)
                (context / "start-kernel").chmod(0o755)

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
                _say(console, f"{len(wheels)} wheels ready in {dt:.1f} s")

                labels = {
                    HASH_LABEL: build_hash,
                    "kernelgw.base": base_name,
                    "kernelgw.base-id": base_image.id,
                    "kernelgw.python": pyver,
                    "kernelgw.machine": machine,
                    "kernelgw.glibc": "{}.{}".format(*info["glibc"]),
                    "kernelgw.packages": json.dumps(packages_from_wheels(wheels), separators=(",", ":")),
                }
                t0 = time.monotonic()
                image_id, seen = _stream_build(
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

            _cleanup_after_build(client, image_id, seen)
            seconds = time.monotonic() - t_start
            _say(console, f"built {tag} ({image_id[7:19]}) in {seconds:.0f} s")
            return ImageBuildResult(tag, image_id, True, base_name, seconds, tuple(timings))
    finally:
        client.close()
