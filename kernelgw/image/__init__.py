"""The kernel image: how it is built without a registry (debootstrap base, host-side
wheels, ``docker build --network none``), and the facts about a built image that
the runtime needs (wheel platforms, the host-side pip and wheel cache).

May import: ``kernelgw.errors`` and third-party packages only. The runtime imports
the names re-exported here, never the modules behind them.

One module a job: :mod:`.builder` runs a build from :mod:`.base` (with
:mod:`.debootstrap` and :mod:`.apt_mirror` for the offline base), :mod:`.context`
(inputs and their hash), :mod:`.wheels` (pip on the host) and
:mod:`.docker_build`; :mod:`.language` builds other languages' kernels on that
image (with :mod:`.debs` for their Debian packages), :mod:`.bundle` several in one; :mod:`.engine`, :mod:`.cache`, :mod:`.names`,
:mod:`.errors` and :mod:`.progress` serve them. :mod:`.gateway` builds the gateway's
own container image (images/gateway) the same way, :mod:`.standins` the PostgreSQL
and HAProxy images compose.yaml can use where no registry answers.
"""

from kernelgw.image.builder import ImageBuildResult, build_image
from kernelgw.image.bundle import build_bundle_image
from kernelgw.image.cache import cache_dir
from kernelgw.image.engine import image_exists
from kernelgw.image.errors import BaseImageError, ImageBuildError, WheelDownloadError
from kernelgw.image.language import build_kernel_image, language_dir
from kernelgw.image.names import DEFAULT_TAG, HASH_LABEL
from kernelgw.image.wheels import manylinux_platforms, packages_from_wheels, pip_command, pip_download_command

__all__ = [
    "DEFAULT_TAG",
    "HASH_LABEL",
    "BaseImageError",
    "ImageBuildError",
    "ImageBuildResult",
    "WheelDownloadError",
    "build_bundle_image",
    "build_image",
    "build_kernel_image",
    "cache_dir",
    "image_exists",
    "language_dir",
    "manylinux_platforms",
    "packages_from_wheels",
    "pip_command",
    "pip_download_command",
]
