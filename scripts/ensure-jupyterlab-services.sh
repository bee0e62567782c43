#!/usr/bin/env bash
# JupyterLab's own client library, @jupyterlab/services (what JupyterLab's and
# VS Code's notebooks use to talk to a Jupyter server), with `ws` for Node, for
# tests/integration/test_jupyter_lab_services.py. From the npm registry into
# ${KERNELGW_NODE_DIR:-/var/cache/kernelgw/node}; Node and npm from Debian when
# missing. Idempotent: does nothing when they are installed. Prints the directory.
set -euo pipefail
dir=${KERNELGW_NODE_DIR:-/var/cache/kernelgw/node}
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  echo "installing Debian's nodejs and npm" >&2
  $SUDO apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends nodejs npm >&2
fi
if [ ! -f "$dir/node_modules/@jupyterlab/services/package.json" ] || [ ! -f "$dir/node_modules/ws/package.json" ]; then
  mkdir -p "$dir"
  echo "installing @jupyterlab/services 7 and ws into $dir" >&2
  npm install --prefix "$dir" --no-audit --no-fund --loglevel=error "@jupyterlab/services@^7" "ws@^8" >&2
fi
echo "$dir"
