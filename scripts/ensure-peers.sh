#!/usr/bin/env bash
# A separate virtualenv for benchmarks/bench_peers.py: kernelgw[server,bench] plus the
# peers it is compared with, from PyPI, so the project's own lock stays as it is.
# Idempotent: a stamp of this script and the lock skips the install when nothing changed.
#
#   scripts/ensure-peers.sh          prints the venv's python on its last line
#
# The peers' shared dependencies are pinned by requirements/lock.txt (used as
# constraints: no peer may move one of kernelgw's pins); the peers themselves are
# pinned here, because the adapters in benchmarks/peers/ follow their APIs:
#   - autogen-ext[docker-jupyter-executor]  DockerJupyterCodeExecutor + DockerJupyterServer
#   - smolagents[docker]                    DockerExecutor (a Kernel Gateway in a container)
#   - llm-sandbox[docker]                   (pinned by the bench extra in pyproject.toml)
# Environment: KERNELGW_PEERS_VENV (default .venv-peers in the checkout).
set -euo pipefail
cd "$(dirname "$0")/.."

venv=${KERNELGW_PEERS_VENV:-.venv-peers}
peers=(pip "autogen-ext[docker-jupyter-executor]==0.7.5" "smolagents[docker]==1.26.0")
stamp="$venv/.kernelgw-peers-installed"
want=$( (cat "$0" requirements/lock.txt pyproject.toml) | sha256sum | cut -d' ' -f1)

if [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
  echo "ensure-peers: up to date" >&2
  echo "$venv/bin/python"
  exit 0
fi

uv=$(command -v uv || true)
[ -n "$uv" ] || { [ -x .venv/bin/uv ] && uv=.venv/bin/uv; } || true
if [ -n "$uv" ]; then
  # uv venv also writes a .gitignore into the venv: git never sees it
  [ -x "$venv/bin/python" ] || "$uv" venv -q --python "${PYTHON:-python3}" "$venv" >&2
  "$uv" pip install -q --python "$venv/bin/python" -c requirements/lock.txt -e '.[server,bench]' "${peers[@]}" >&2
else
  [ -x "$venv/bin/python" ] || { "${PYTHON:-python3}" -m venv "$venv" && echo '*' > "$venv/.gitignore"; }
  "$venv/bin/python" -m pip install -q -c requirements/lock.txt -e '.[server,bench]' "${peers[@]}" >&2
fi
echo "$want" > "$stamp"
echo "ensure-peers: installed kernelgw[server,bench] and ${peers[*]} into $venv" >&2
echo "$venv/bin/python"
