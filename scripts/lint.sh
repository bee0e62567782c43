#!/usr/bin/env bash
# Static checks, all of them, even when an earlier one fails: ruff (lint and
# format), mypy (strict, on the package and images/: pyproject.toml) and import-linter (the layers' contracts
# in pyproject.toml), the Kubernetes manifests and the docs site (mkdocs build --strict). Exits non-zero when any check fails. Needs the dev tools
# from the lock (scripts/setup.sh installs them).
set -uo pipefail
cd "$(dirname "$0")/.."
bin=.venv/bin
status=0
check() {
  local name=$1; shift
  printf '==> %s\n' "$name"
  if "$@"; then printf '    %s: ok\n' "$name"; else printf '    %s: FAILED\n' "$name" >&2; status=1; fi
}
check "ruff check" "$bin/ruff" check --output-format concise .
check "ruff format" "$bin/ruff" format --check .
check "mypy --strict" "$bin/mypy"
# --no-cache: a cache left by an earlier run once hid a new import cycle that a clean clone found
check "import contracts" "$bin/lint-imports" --no-cache
check "kubernetes manifests" bash scripts/check-kubernetes.sh
# every link, anchor and docstring reference of the site resolves (mkdocs.yml)
check "mkdocs build --strict" bash scripts/docs.sh build
exit "$status"
