#!/usr/bin/env bash
# Write requirements/lock.txt: every package of kernelgw[all,test,dev], pinned, for
# CPython 3.11 on Linux, resolved against PyPI (uv reads no pip configuration, so
# no local index leaks into the lock). scripts/setup.sh installs from it.
#
#   bash scripts/lock.sh                         add what pyproject.toml now asks for, keep other pins
#   bash scripts/lock.sh --upgrade               every package to its newest allowed version
#   bash scripts/lock.sh --upgrade-package httpx one package
set -euo pipefail
cd "$(dirname "$0")/.."
uv=.venv/bin/uv
[ -x "$uv" ] || uv=uv
exec "$uv" pip compile pyproject.toml \
  --extra all --extra test --extra dev \
  --python-version 3.11 --python-platform linux \
  --custom-compile-command "bash scripts/lock.sh" \
  --output-file requirements/lock.txt \
  --quiet "$@"
