#!/usr/bin/env bash
# HAProxy for the cluster test (tests/integration/test_cluster.py): installs
# Debian's haproxy when it is missing and prints the binary's path on stdout
# (everything else goes to stderr). Safe to run again. The package's own
# service is not started or used: the test runs haproxy in the foreground
# with its own configuration.
set -euo pipefail

say() { printf '%s\n' "$*" >&2; }

if ! command -v haproxy >/dev/null 2>&1 && [ ! -x /usr/sbin/haproxy ]; then
  say "installing haproxy (Debian package)"
  export DEBIAN_FRONTEND=noninteractive
  # policy-rc.d: the package must not start its own service on port 80 (the test runs its own)
  had_policy=0
  [ -e /usr/sbin/policy-rc.d ] && had_policy=1
  if [ "$had_policy" -eq 0 ]; then printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d; fi
  apt-get update -qq >&2 || true
  apt-get install -y -qq --no-install-recommends haproxy >&2
  if [ "$had_policy" -eq 0 ]; then rm -f /usr/sbin/policy-rc.d; fi
fi
command -v haproxy 2>/dev/null || echo /usr/sbin/haproxy
