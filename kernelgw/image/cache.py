"""The builder's files on the host: wheel caches per target, build contexts, the build lock.

The runtime resolves session installs into the same wheel cache, so both
name it through :func:`cache_dir`.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kernelgw"


@contextlib.contextmanager
def build_lock() -> Iterator[None]:
    """Serialise builds on this machine (tests and the CLI may race)."""
    path = cache_dir() / "build.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
