#!/usr/bin/env bash
# Set up (engine, venv, image) when needed, then run every test: unit tests and
# integration tests against the real engine. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "==> PostgreSQL for the storage tests"
# the history tests run on SQLite and on this real PostgreSQL server
KERNELGW_TEST_DATABASE_URL=${KERNELGW_TEST_DATABASE_URL:-$(bash scripts/ensure-postgres.sh)}
export KERNELGW_TEST_DATABASE_URL
echo "$KERNELGW_TEST_DATABASE_URL"
echo "==> Chromium for the web page tests"
bash scripts/ensure-chromium.sh
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1  # Debian's chromium only, never a downloaded browser
echo "==> pytest"
mkdir -p test-output
set +e
.venv/bin/python -m pytest tests "$@"
status=$?
set -e
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests: that is a failure here" >&2
  exit 1
fi
exit "$status"
