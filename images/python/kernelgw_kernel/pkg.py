"""Install wheels the gateway resolved on the host, run with ``docker exec``::

    python -I -m kernelgw_kernel.pkg list
    python -I -m kernelgw_kernel.pkg install

``list`` answers ``{"ok": true, "packages": {name: version}}`` for what the
session's package directory holds. ``install`` reads a tar archive of ``.whl``
files from stdin, framed as in fs.py (4-byte length + data, zero length ends),
and installs them with pip, offline and without dependencies (the gateway
already resolved them), into the package directory, which the kernel has on
``sys.path``. Answers are JSON lines like fs.py's.
"""

from __future__ import annotations

import argparse
import errno
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from typing import Any

from kernelgw_kernel import PACKAGES_DIR
from kernelgw_kernel.fs import Refused, fail, read_frames, say

WHEEL_NAME = re.compile(
    r"^[A-Za-z0-9_.]+-[A-Za-z0-9_.!+]+(-[0-9][A-Za-z0-9_.]*)?-[A-Za-z0-9_.]+-[A-Za-z0-9_.]+-[A-Za-z0-9_.]+\.whl$"
)


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed(target: str) -> dict[str, str]:
    """{normalised name: version} of the ``*.dist-info`` directories in ``target``."""
    found: dict[str, str] = {}
    try:
        names = os.listdir(target)
    except FileNotFoundError:
        return found
    for name in names:
        if name.endswith(".dist-info"):
            dist, _, version = name[: -len(".dist-info")].partition("-")
            found[normalize(dist)] = version
    return dict(sorted(found.items()))


class _FrameReader(io.RawIOBase):
    """The framed input as a raw stream, for tarfile's stream mode."""

    def __init__(self) -> None:
        self._frames: Any = read_frames(sys.stdin.buffer)
        self._chunk = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if not self._chunk:
            data = next(self._frames, None)
            if data is None:
                return 0
            self._chunk = memoryview(data)
        n = min(len(buffer), len(self._chunk))
        buffer[:n] = self._chunk[:n]
        self._chunk = self._chunk[n:]
        return n


def cmd_install(target: str) -> None:
    staging = tempfile.mkdtemp(prefix="kernelgw-wheels-")
    try:
        wheels = []
        try:
            with tarfile.open(fileobj=io.BufferedReader(_FrameReader(), 1 << 20), mode="r|") as tar:
                for member in tar:
                    name = os.path.basename(member.name)
                    if not member.isfile() or not WHEEL_NAME.match(name) or name != member.name:
                        raise Refused("invalid_archive", f"unexpected archive member {member.name!r}")
                    src = tar.extractfile(member)
                    assert src is not None
                    with open(os.path.join(staging, name), "xb") as dst:
                        shutil.copyfileobj(src, dst, 1 << 20)
                    wheels.append(name)
        except tarfile.TarError as exc:
            raise Refused("invalid_archive", f"the wheel archive is unreadable: {exc}") from None
        before = installed(target)
        if not wheels:
            say(sys.stdout.buffer, {"ok": True, "installed": [], "packages": before})
            return
        proc = subprocess.run(
            [
                sys.executable,
                "-I",  # no user site, working directory or PYTHON* variable: the kernel writes those
                "-m",
                "pip",
                "install",
                "--isolated",  # nor pip's user configuration or PIP_* variables
                "--no-index",
                "--no-deps",
                "--no-cache-dir",
                "--disable-pip-version-check",
                "--no-warn-script-location",
                "--upgrade",
                "--target",
                target,
                *[os.path.join(staging, w) for w in sorted(wheels)],
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=staging,
        )
        if proc.returncode != 0:
            tail = "\n".join(proc.stdout.strip().splitlines()[-15:])
            code = "no_space" if "No space left on device" in proc.stdout else "pip_failed"
            raise Refused(code, f"pip install failed (exit {proc.returncode}):\n{tail}")
        after = installed(target)
        changed = [{"name": n, "version": v} for n, v in after.items() if before.get(n) != v]
        say(sys.stdout.buffer, {"ok": True, "installed": changed, "packages": after})
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="kernelgw_kernel.pkg")
    parser.add_argument("--target", default=PACKAGES_DIR)
    parser.add_argument("command", choices=["list", "install"])
    args = parser.parse_args(argv)
    out = sys.stdout.buffer
    try:
        if args.command == "list":
            say(out, {"ok": True, "packages": installed(args.target)})
        else:
            cmd_install(args.target)
    except Refused as exc:
        fail(out, exc.code, exc.message)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            fail(out, "no_space", f"no space left for the wheels or the package directory: {exc}")
        fail(out, "io_error", str(exc))


if __name__ == "__main__":
    main()
