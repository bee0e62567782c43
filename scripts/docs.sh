#!/usr/bin/env bash
# The documentation site (mkdocs.yml, docs/): MkDocs with Material for MkDocs.
#
#   bash scripts/docs.sh serve      preview on http://127.0.0.1:8001, rebuilt on every save
#   bash scripts/docs.sh build      build into site/ with --strict (a broken link or anchor,
#                                   a page missing from the nav, a bad docstring reference fails)
#   bash scripts/docs.sh generate   rewrite the generated pages (settings, OpenAPI) from the code
#
# Needs the dev tools from the lock (scripts/setup.sh installs them). scripts/lint.sh runs `build`.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=.venv/bin
export NO_MKDOCS_2_WARNING=1  # Material's notice about its successor, printed on every build
case "${1:-}" in
  serve) shift; exec "$bin/mkdocs" serve --dev-addr "${KERNELGW_DOCS_ADDR:-127.0.0.1:8001}" "$@" ;;
  build) shift; exec "$bin/mkdocs" build --strict --quiet "$@" ;;
  generate) shift; exec "$bin/python" scripts/gen_docs.py "$@" ;;
  *) echo "usage: bash scripts/docs.sh serve|build|generate" >&2; exit 2 ;;
esac
