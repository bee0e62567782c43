"""kernelgw's helper inside the kernel container.

Three jobs, all standard library only:

- An IPython extension (``start-kernel`` passes ``--ext=kernelgw_kernel``):
  before every cell (``pre_run_cell``; silent requests do not fire it) it
  notes the workspace's files, and :func:`artifacts` answers which files the
  cell created or changed. The gateway evaluates
  ``__import__('kernelgw_kernel').artifacts()`` as a user_expression after
  each cell; its ``text/plain`` is a JSON list of
  ``{"path", "size", "mime_type", "change"}``. The extension also puts the
  session's package directory (a tmpfs the gateway installs wheels into) on
  ``sys.path`` and drops the import system's cached listing of it before each
  cell, so a package installed a moment ago imports without a restart.
- ``python -I -m kernelgw_kernel.fs``: workspace file operations the gateway
  runs with ``docker exec`` (see fs.py).
- ``python -I -m kernelgw_kernel.pkg``: installs wheels the gateway sends into
  the package directory (see pkg.py).

This module is imported into every kernel, so it imports nothing heavy.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

WORKSPACE = "/workspace"
PACKAGES_DIR = "/opt/kernelgw/packages"
"""A tmpfs per session; on ``sys.path`` after the image's own site-packages,
so the image's preinstalled packages always win."""
UPLOAD_PREFIX = ".kernelgw-upload-"
"""Temporary files of uploads in progress; never reported or listed."""
SKIP_DIRS = frozenset({"__pycache__", ".ipynb_checkpoints", ".git", "node_modules", ".venv"})
MAX_WALK = 5_000
"""Files noted per snapshot; a workspace with more is only partly watched. A
snapshot costs 3-4 us per file and each cell takes two, so this bounds the
per-cell overhead at about 45 ms (0.5 ms for 100 files)."""
MAX_ARTIFACTS = 1000

# Types Python's built-in table lacks or spells differently. Checked before it;
# kernelgw/runtime/workspace.py carries the same table (a unit test keeps them equal).
EXTRA_MIME_TYPES = {
    ".csv": "text/csv",
    ".db": "application/vnd.sqlite3",
    ".docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
    ".feather": "application/vnd.apache.arrow.file",
    ".geojson": "application/geo+json",
    ".ipynb": "application/x-ipynb+json",
    ".js": "text/javascript",
    ".jsonl": "application/jsonl",
    ".log": "text/plain",
    ".md": "text/markdown",
    ".ndjson": "application/x-ndjson",
    ".parquet": "application/vnd.apache.parquet",
    ".pptx": "application/vnd.openxmlformats-officedocument.presentationml.presentation",
    ".sqlite": "application/vnd.sqlite3",
    ".toml": "application/toml",
    ".tsv": "text/tab-separated-values",
    ".wav": "audio/wav",
    ".webp": "image/webp",
    ".xlsx": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
    ".yaml": "application/yaml",
    ".yml": "application/yaml",
}
ENCODING_MIME_TYPES = {
    "gzip": "application/gzip",
    "bzip2": "application/x-bzip2",
    "xz": "application/x-xz",
    "compress": "application/x-compress",
    "br": "application/x-brotli",
}
_mimetypes: Any = None


def guess_mime(path: str) -> str:
    """MIME type from the file name: the table above, then Python's built-in
    one (never the system's /etc/mime.types, so every host agrees)."""
    global _mimetypes
    name = path.rsplit("/", 1)[-1].lower()
    dot = name.rfind(".")
    if dot > 0 and name[dot:] in EXTRA_MIME_TYPES:
        return EXTRA_MIME_TYPES[name[dot:]]
    if _mimetypes is None:
        import mimetypes

        _mimetypes = mimetypes.MimeTypes()
    mime, encoding = _mimetypes.guess_type(name, strict=False)
    if encoding:
        return ENCODING_MIME_TYPES.get(encoding, "application/octet-stream")
    return mime or "application/octet-stream"


# ------------------------------------------------------------------ artifacts

Snapshot = dict[str, tuple[int, int, int]]
"""Relative path -> (size, mtime_ns, inode) of every regular file."""

_before: Snapshot | None = None


def snapshot(root: str = WORKSPACE, limit: int = MAX_WALK) -> Snapshot:
    """The regular files under ``root`` (symlinks are not followed), at most
    ``limit`` of them."""
    found: Snapshot = {}
    stack = [("", root)]
    while stack:
        rel_dir, abs_dir = stack.pop()
        try:
            # directory order: stable while a directory is unchanged (sorting
            # 10,000 names would cost more than the rest of the walk)
            with os.scandir(abs_dir) as it:
                entries = list(it)
        except OSError:
            continue
        subdirs = []
        for entry in entries:
            rel = rel_dir + entry.name
            try:
                if entry.is_dir(follow_symlinks=False):
                    if entry.name not in SKIP_DIRS:
                        subdirs.append((rel + "/", entry.path))
                    continue
                if not entry.is_file(follow_symlinks=False) or entry.name.startswith(UPLOAD_PREFIX):
                    continue
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            found[rel] = (st.st_size, st.st_mtime_ns, st.st_ino)
            if len(found) >= limit:
                return found
        stack.extend(reversed(subdirs))
    return found


def changes(before: Snapshot, after: Snapshot) -> list[dict[str, Any]]:
    """Files in ``after`` that are new or differ from ``before``, by path."""
    out = []
    for path in sorted(after):
        size, mtime, ino = after[path]
        old = before.get(path)
        if old == (size, mtime, ino):
            continue
        out.append(
            {
                "path": path,
                "size": size,
                "mime_type": guess_mime(path),
                "change": "created" if old is None else "modified",
            }
        )
        if len(out) >= MAX_ARTIFACTS:
            break
    return out


class ArtifactReport:
    """What :func:`artifacts` returns; its repr is the JSON the gateway reads."""

    def __init__(self, items: list[dict[str, Any]]) -> None:
        self.items = items

    def __repr__(self) -> str:
        return json.dumps(self.items, separators=(",", ":"))

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(repr(self))


def artifacts() -> ArtifactReport:
    """Workspace files created or changed since the current cell started."""
    if _before is None:
        return ArtifactReport([])
    return ArtifactReport(changes(_before, snapshot()))


def _pre_run_cell(info: Any = None) -> None:
    global _before
    finder = sys.path_importer_cache.get(PACKAGES_DIR)
    invalidate = getattr(finder, "invalidate_caches", None)  # optional on a path entry finder
    if invalidate is not None:
        invalidate()
    _before = snapshot()


def load_ipython_extension(ip: Any) -> None:
    if PACKAGES_DIR not in sys.path:
        sys.path.append(PACKAGES_DIR)
    ip.events.register("pre_run_cell", _pre_run_cell)


def unload_ipython_extension(ip: Any) -> None:
    try:
        ip.events.unregister("pre_run_cell", _pre_run_cell)
    except ValueError:
        pass
