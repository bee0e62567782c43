"""How the browser tests launch Chromium: Debian's package (scripts/ensure-chromium.sh),
headless, with nothing that reaches out to the network by itself."""

from __future__ import annotations

import os

CHROMIUM = os.environ.get("KERNELGW_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
]
