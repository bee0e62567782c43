#!/usr/bin/env bash
# Chromium for the web page's end-to-end tests (tests/integration/test_web.py):
# Debian's package, never a browser downloaded by Playwright. Idempotent: does
# nothing when /usr/bin/chromium is already there.
set -euo pipefail
if [ -n "${KERNELGW_CHROMIUM:-}" ] && [ -x "$KERNELGW_CHROMIUM" ]; then
  echo "chromium: $KERNELGW_CHROMIUM"
  exit 0
fi
if [ -x /usr/bin/chromium ]; then
  echo "chromium: $(/usr/bin/chromium --version 2>/dev/null | head -n1)"
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "No /usr/bin/chromium and no apt-get: install Chromium, or set KERNELGW_CHROMIUM to its path" >&2
  exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "installing Debian's chromium"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium
/usr/bin/chromium --version 2>/dev/null | head -n1
