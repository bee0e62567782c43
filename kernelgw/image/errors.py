"""What goes wrong in an image build, each failure carrying the end of its log.

KernelGWError
 └── ImageBuildError        any step of the build (docker build itself)
      ├── BaseImageError    the base image: found, pulled or made with debootstrap
      └── WheelDownloadError  pip download of the wheelhouse on the host
"""

from __future__ import annotations

from kernelgw.errors import KernelGWError

LOG_TAIL_LINES = 40
"""How many of a failed step's last log lines an error carries."""


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
