#!/usr/bin/env bash
# Run the whole benchmark suite, one script after the other, and regenerate
# docs/benchmarks.md from the results (docs/bench/*.json and *.png).
#
#   scripts/bench.sh            full run, about 25 minutes on a 2-core machine (10 of them
#                               the 100 kill -9 rounds of bench_crash)
#   scripts/bench.sh --quick    small n, a few minutes; results go to /tmp/kernelgw-bench-quick
#                               (docs/ is left alone) unless --out is given
#   scripts/bench.sh --out DIR  JSON/PNG to DIR, the page to DIR/benchmarks.md
#
# bench_ack compares with the tree before "acknowledged means stored": a `git archive`
# of KERNELGW_ACK_BEFORE (default d7b8a43, the last commit before the durable-sessions
# work) in a temporary directory.
#
# Sets up nothing heavy: it installs the `bench` extra into .venv (matplotlib,
# llm-sandbox) and expects a running Docker engine and the kernel image
# (scripts/setup.sh or scripts/serve.sh provide both). Run it on a quiet machine:
# everything (clients, gateway, kernels) shares the same cores.
set -euo pipefail
cd "$(dirname "$0")/.."

quick=""
out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick="--quick" ;;
    --out) out="$2"; shift ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "unknown option: $1" >&2; exit 2 ;;
  esac
  shift
done
if [ -z "$out" ]; then
  if [ -n "$quick" ]; then out=/tmp/kernelgw-bench-quick; else out=docs/bench; fi
fi
if [ "$out" = docs/bench ]; then page=docs/benchmarks.md; else page="$out/benchmarks.md"; fi
mkdir -p "$out"

image=${KERNELGW_IMAGE:-kernelgw/python:latest}
docker info >/dev/null 2>&1 || { echo "no Docker engine answers: run scripts/ensure-docker.sh first" >&2; exit 1; }
docker image inspect "$image" >/dev/null 2>&1 || {
  echo "kernel image $image is missing: run scripts/setup.sh (or .venv/bin/kernelgw image build)" >&2; exit 1; }

[ -x .venv/bin/python ] || python3 -m venv .venv
echo "==> pip install -e '.[bench]'"
.venv/bin/python -m pip install -q -e '.[bench]'

py=.venv/bin/python
start=$(date +%s)
run() {
  local name=$1; shift
  echo
  echo "==> benchmarks/bench_$name.py $*"
  local t0; t0=$(date +%s)
  "$py" "benchmarks/bench_$name.py" $quick --image "$image" --json "$out/$name.json" --chart "$out/$name.png" "$@"
  echo "    ($(( $(date +%s) - t0 )) s)"
}
run core
run start
run exec
run agent
run flood
run isolation  # four paced bystanders against three kinds of flood (issue 15)
run memory
run scale
run security
run reattach --sessions 20
run continuity
run pool
run jupyter
run e2b  # E2B's SDK through the /e2b face against kernelgw's own SDK
run e2b_envd  # E2B's commands.run and sandbox.files against the engine's exec and kernelgw's files API
# two gateways on one PostgreSQL (many gateways as one service)
KERNELGW_TEST_DATABASE_URL=${KERNELGW_TEST_DATABASE_URL:-$(bash scripts/ensure-postgres.sh)}
export KERNELGW_TEST_DATABASE_URL
run cluster
# one gateway as 1 and 2 worker processes (kernelgw serve --workers N): aggregate executions per second
run workers
run languages
py="$(bash scripts/ensure-peers.sh)" run peers  # the peers' own venv (about 4 min)
ack_before=${KERNELGW_ACK_BEFORE:-d7b8a43}
ack_tree=$(mktemp -d /tmp/kgw_before.XXXXXX)
trap 'rm -rf "$ack_tree"' EXIT
git archive "$ack_before" | tar -x -C "$ack_tree"
run ack --before "$ack_tree" --before-commit "$ack_before"
run crash || echo "    bench_crash counted lost, unmarked or leaked (see its JSON); the page says so"
echo
echo "==> benchmarks/probe_iopub_hwm.py (a probe for a known issue, not a benchmark)"
"$py" benchmarks/probe_iopub_hwm.py --image "$image" --json "$out/probe_iopub_hwm.json"
echo
"$py" benchmarks/report.py --dir "$out" --out "$page"
echo "==> all benchmarks done in $(( $(date +%s) - start )) s; results in $out, page $page"
