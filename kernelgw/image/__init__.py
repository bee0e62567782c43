"""The kernel image: how it is built without a registry (debootstrap base, host-side
wheels, ``docker build --network none``), and the facts about a built image that
the runtime needs (wheel platforms, the host-side pip cache).

May import: ``kernelgw.errors`` and third-party packages only. The runtime imports
the names re-exported here, never the builder's private helpers.
"""

from kernelgw.image.builder import (
    DEFAULT_TAG,
    BaseImageError,
    ImageBuildError,
    ImageBuildResult,
    WheelDownloadError,
    build_image,
    cache_dir,
    image_exists,
    manylinux_platforms,
    packages_from_wheels,
)

__all__ = [
    "DEFAULT_TAG",
    "BaseImageError",
    "ImageBuildError",
    "ImageBuildResult",
    "WheelDownloadError",
    "build_image",
    "cache_dir",
    "image_exists",
    "manylinux_platforms",
    "packages_from_wheels",
]
