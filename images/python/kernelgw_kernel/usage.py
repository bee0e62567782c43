"""``python -m kernelgw_kernel.usage``: the workspace's disk use and size, one
JSON line (``{"disk_used": bytes, "disk_total": bytes}``), for a sandbox's
metrics. Its file system is the session's own tmpfs, sized by its quota."""

from __future__ import annotations

import json
import os
import sys

import kernelgw_kernel


def main() -> None:
    vfs = os.statvfs(kernelgw_kernel.WORKSPACE)
    total = vfs.f_blocks * vfs.f_frsize
    used = (vfs.f_blocks - vfs.f_bfree) * vfs.f_frsize
    sys.stdout.write(json.dumps({"disk_used": used, "disk_total": total}) + "\n")


if __name__ == "__main__":
    main()
