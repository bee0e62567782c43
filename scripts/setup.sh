#!/usr/bin/env bash
# Make this checkout ready to serve and test: a Docker engine that answers, a
# virtualenv with kernelgw installed, and the kernel image. Safe to run again:
# every step checks first and does nothing when already done.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '\033[1m==> %s\033[0m\n' "$*"; }

say "Docker engine"
bash scripts/ensure-docker.sh

PY=${PYTHON:-python3}
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "kernelgw needs Python 3.11 or newer ($PY is $("$PY" --version 2>&1))" >&2
  exit 1
fi

say "Python environment (.venv)"
# Every dependency comes pinned from requirements/lock.txt (kernelgw[all,test,dev]);
# after changing dependencies in pyproject.toml, or to upgrade them, run
# `bash scripts/lock.sh` (or `bash scripts/lock.sh --upgrade`) and commit the lock.
stamp=.venv/.kernelgw-installed
want=$(cat requirements/lock.txt pyproject.toml | sha256sum | cut -d' ' -f1)
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -r requirements/lock.txt
  .venv/bin/python -m pip install --quiet --no-deps -e '.[all,test,dev]'
  echo "$want" > "$stamp"
  echo "installed kernelgw[all,test,dev] from requirements/lock.txt"
else
  echo "up to date"
fi

say "Kernel image"
.venv/bin/kernelgw image build
