#!/usr/bin/env bash
# The Node client libraries the tests drive unchanged: JupyterLab's own
# @jupyterlab/services (what JupyterLab's and VS Code's notebooks use to talk to
# a Jupyter server) with `ws` for Node, for tests/integration/test_jupyter_lab_services.py;
# and E2B's JavaScript SDK, @e2b/code-interpreter (pinned), for
# tests/integration/e2b/test_js_sdk.py. From the npm registry into
# ${KERNELGW_NODE_DIR:-/var/cache/kernelgw/node}; Node and npm from Debian when
# missing. Idempotent: does nothing when they are installed. Prints the directory.
set -euo pipefail
dir=${KERNELGW_NODE_DIR:-/var/cache/kernelgw/node}
E2B_JS="@e2b/code-interpreter@2.8.0"
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  echo "installing Debian's nodejs and npm" >&2
  $SUDO apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends nodejs npm >&2
fi
wanted=()
if [ ! -f "$dir/node_modules/@jupyterlab/services/package.json" ] || [ ! -f "$dir/node_modules/ws/package.json" ]; then
  wanted+=("@jupyterlab/services@^7" "ws@^8")
fi
if ! grep -qs '"version": "2.8.0"' "$dir/node_modules/@e2b/code-interpreter/package.json"; then
  wanted+=("$E2B_JS")
fi
if [ "${#wanted[@]}" -gt 0 ]; then
  mkdir -p "$dir"
  echo "installing ${wanted[*]} into $dir" >&2
  npm install --prefix "$dir" --no-audit --no-fund --loglevel=error "${wanted[@]}" >&2
fi
echo "$dir"
