"""Image names and labels the build writes and reads back.

Shared by the modules that make a base, build the kernel image and decide
whether a build is needed, so that they agree on what is called what.
"""

from __future__ import annotations

DEFAULT_TAG = "kernelgw/python:latest"
SLIM_BASE = "python:3.12-slim"
DEBOOTSTRAP_BASE = "kernelgw/base:bookworm"

HASH_LABEL = "kernelgw.build-hash"
"""The label holding the hash of the build inputs: equal hash, no rebuild."""
STAGE_LABEL = "kernelgw.stage"
