#!/usr/bin/env bash
# Set up (engine, venv, image) when needed, then start the gateway.
# Arguments go to `kernelgw serve` (for example --host, --port, --config).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "==> kernelgw serve $*"
exec .venv/bin/kernelgw serve "$@"
