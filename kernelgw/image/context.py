"""The build context (images/python) and the hash that says whether it changed.

The hash covers the context files and the base image id; an image whose
``kernelgw.build-hash`` label carries it is up to date and is not rebuilt.
"""

from __future__ import annotations

import hashlib
import os
import sys
import sysconfig
from collections.abc import Mapping
from pathlib import Path

from kernelgw.image.errors import ImageBuildError

# Bump when the way the image is built changes in a way the hashed files do
# not show (e.g. the wheel download options), to force one rebuild.
BUILD_FORMAT = "1"
CONTEXT_FILES = ("Dockerfile", "requirements.txt", "start-kernel")
"""The files every Python image context has; ``kernelgw_kernel/*.py`` come on top."""
HELPER_PACKAGE = "kernelgw_kernel"
"""The in-kernel helper package (artifacts, files, packages, the shim and the
kernels of our own for other languages): every module of it is in the context."""


INSTALLED_IMAGE_DIR = Path("share") / "kernelgw" / "images" / "python"
"""Where a wheel installs the build context, under the install scheme's data path
(``sys.prefix`` in a virtualenv; pyproject.toml's ``data-files``)."""


def default_image_dir() -> Path:
    """``KERNELGW_IMAGE_DIR``; else ``images/python`` of the source tree this package
    runs from; else the copy a wheel installed (``pip install kernelgw``)."""
    env = os.environ.get("KERNELGW_IMAGE_DIR")
    if env:
        return Path(env)
    source = Path(__file__).resolve().parents[2] / "images" / "python"
    if (source / "Dockerfile").is_file():
        return source
    for data in dict.fromkeys([sysconfig.get_path("data"), sys.prefix]):
        installed = Path(data) / INSTALLED_IMAGE_DIR
        if (installed / "Dockerfile").is_file():
            return installed
    return source  # missing: read_context_files names it in its error


def context_names(image_dir: Path) -> list[str]:
    """The files that make up the context: :data:`CONTEXT_FILES` and every module
    of :data:`HELPER_PACKAGE`, relative to ``image_dir``."""
    modules = sorted(p.relative_to(image_dir).as_posix() for p in (image_dir / HELPER_PACKAGE).glob("*.py"))
    return [*CONTEXT_FILES, *modules]


def read_context_files(image_dir: Path) -> dict[str, bytes]:
    files = {}
    names = context_names(image_dir)
    if len(names) == len(CONTEXT_FILES):
        names.append(f"{HELPER_PACKAGE}/__init__.py")  # missing: named in the error below
    for name in names:
        path = image_dir / name
        try:
            files[name] = path.read_bytes()
        except OSError as exc:
            raise ImageBuildError(
                f"Missing build input {path} ({exc.strerror}). Set KERNELGW_IMAGE_DIR to "
                "the images/python directory of a kernelgw source tree."
            ) from exc
    return files


def write_context(files: Mapping[str, bytes], context: Path) -> None:
    """Lay the files out in ``context`` for ``docker build``."""
    for name, data in files.items():
        (context / name).parent.mkdir(parents=True, exist_ok=True)
        (context / name).write_bytes(data)
    (context / "start-kernel").chmod(0o755)


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
