#!/usr/bin/env bash
# Jupyter Enterprise Gateway (pinned), for tests/integration/test_enterprise_gateway_client.py,
# which drives its own client (enterprise_gateway.client.gateway_client.GatewayClient)
# against kernelgw. It lives in a tool venv of its own under the kernelgw cache, never
# in .venv: its server pins jupyter-client<7, jupyter-server<2 and pyzmq<25 and brings
# kubernetes, paramiko and yarn-api-client, none of which the product should carry.
# pip resolves those old pins there normally. Installed the first time (from PyPI),
# reused afterwards (offline). Prints the venv's python.
set -euo pipefail

VERSION=3.3.0
tools=${XDG_CACHE_HOME:-$HOME/.cache}/kernelgw/tools/enterprise-gateway-$VERSION
stamp=$tools/.kernelgw-installed
mkdir -p "$(dirname "$tools")"
# one installer at a time (a test run by hand beside scripts/test.sh)
exec 9>"$tools.lock"
flock 9
if [ "$(cat "$stamp" 2>/dev/null)" != "$VERSION" ]; then
  echo "installing jupyter_enterprise_gateway $VERSION into $tools" >&2
  rm -rf "$tools"
  python3 -m venv "$tools"
  "$tools/bin/python" -m pip install -q --disable-pip-version-check "jupyter_enterprise_gateway==$VERSION" >&2
  "$tools/bin/python" -m pip check --disable-pip-version-check >&2
  "$tools/bin/python" -c 'import enterprise_gateway.client.gateway_client' >&2
  echo "$VERSION" >"$stamp"
fi
echo "$tools/bin/python"
