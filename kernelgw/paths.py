"""Workspace path rules: which names a client may give for a file in a session's
workspace. Pure, shared by the gateway (which enforces them before any helper
runs in the container) and the CLI (which saves files the kernel names, and
trusts no name it did not check)."""

from __future__ import annotations

from kernelgw.errors import InvalidPath

MAX_PATH_BYTES = 4096
MAX_NAME_BYTES = 255


def validate_path(path: str, *, allow_root: bool = False) -> str:
    """``path`` as a workspace-relative path, or :class:`InvalidPath`.

    Refused: NUL, absolute paths, ``..`` and ``.`` components, empty components
    (``a//b``), backslashes, more than 4096 bytes or a component of more than 255.
    A trailing ``/`` is dropped. ``allow_root``: ``""`` means the workspace itself.
    """
    if "\x00" in path:
        raise InvalidPath("The path contains a NUL character.")
    if len(path.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES:
        raise InvalidPath(f"The path is longer than {MAX_PATH_BYTES} bytes.")
    if path.startswith("/"):
        raise InvalidPath(f"The path {path!r} is absolute; give it relative to the workspace (e.g. 'data.csv').")
    stripped = path.rstrip("/") if path.endswith("/") and path.strip("/") else path
    if stripped == "":
        if allow_root:
            return ""
        raise InvalidPath("The path is empty; name a file in the workspace (e.g. 'data.csv').")
    for part in stripped.split("/"):
        if part == "..":
            raise InvalidPath(f"The path {path!r} has a '..' component; paths stay inside the workspace.")
        if part in ("", "."):
            raise InvalidPath(f"The path {path!r} has an empty or '.' component.")
        if "\\" in part:
            raise InvalidPath(f"The path {path!r} contains a backslash; separate directories with '/'.")
        if len(part.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
            raise InvalidPath(f"A component of the path is longer than {MAX_NAME_BYTES} bytes.")
    return stripped
