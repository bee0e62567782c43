#!/usr/bin/env bash
# Set up (engine, gVisor, venv, image) when needed, run the static checks (ruff,
# mypy --strict, import contracts: scripts/lint.sh), then every test in three
# passes side by side: the integration tests against the real engine with runc;
# the core integration suite and the adversarial suite again with gVisor (runsc),
# then the unit tests; and the other languages' kernels, after their images are
# built.
# Extra arguments go to every pytest run. The exit status is non-zero when the
# static checks fail, or any pass fails or collects no tests.
# Servers it started (PostgreSQL, and anything a test left running) are stopped
# when it exits; ones running before it started are left alone.
set -euo pipefail
cd "$(dirname "$0")/.."

# Every server this run starts is stopped when it exits, however it exits; servers
# that were already running before it started are left alone. The PostgreSQL
# server is stopped with pg_ctl when this run started it; any other process left
# behind (an HAProxy, a gateway, a browser a test did not stop) carries this run's
# marker in its environment and is ended by it.
KERNELGW_TEST_RUN_MARK="kernelgw-test-$$-$(date +%s%N)"
export KERNELGW_TEST_RUN_MARK
started_postgres_dir=""
# the processes still carrying this run's marker, this shell aside (bash builtins
# only: no child process of the scan itself is listed)
marked_processes() {
  local environ pid line
  for environ in /proc/[0-9]*/environ; do
    pid=${environ#/proc/}
    pid=${pid%/environ}
    if [ "$pid" = "$$" ] || [ "$pid" = "$BASHPID" ]; then continue; fi
    while IFS= read -r -d '' line; do
      if [ "$line" = "KERNELGW_TEST_RUN_MARK=$KERNELGW_TEST_RUN_MARK" ]; then
        echo "$pid"
        break
      fi
    done 2>/dev/null <"$environ" || true
  done
}
stop_started_servers() {
  local status=$? pids
  trap - EXIT INT TERM
  set +e  # clean up everything, whatever fails on the way
  if [ -n "$started_postgres_dir" ]; then
    echo "==> stopping the PostgreSQL server this run started ($started_postgres_dir)" >&2
    local bin
    bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
    if [ "$(id -u)" -eq 0 ]; then
      runuser -u postgres -- "$bin/pg_ctl" -D "$started_postgres_dir/data" -m fast -w stop >&2 || true
    else
      "$bin/pg_ctl" -D "$started_postgres_dir/data" -m fast -w stop >&2 || true
    fi
  fi
  pids=$(marked_processes)
  if [ -n "$pids" ]; then
    echo "==> stopping what this run left running: $(echo $pids)" >&2
    kill -TERM $pids 2>/dev/null || true
    for _ in $(seq 1 50); do
      pids=$(for p in $pids; do [ -e "/proc/$p" ] && echo "$p"; done)
      [ -z "$pids" ] && break
      sleep 0.1
    done
    [ -n "$pids" ] && kill -KILL $pids 2>/dev/null || true
  fi
  exit "$status"
}
trap stop_started_servers EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

bash scripts/setup.sh
echo "==> gVisor (runsc) for the second pass"
bash scripts/ensure-runsc.sh
echo "==> PostgreSQL for the storage tests"
# the history tests run on SQLite and on this real PostgreSQL server
if [ -z "${KERNELGW_TEST_DATABASE_URL:-}" ]; then
  pg_port=${KERNELGW_PG_PORT:-54329}
  pg_ready_before=0
  pg_bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
  if [ -n "$pg_bin" ] && "$pg_bin/pg_isready" -q -h 127.0.0.1 -p "$pg_port" -U postgres; then
    pg_ready_before=1
  fi
  KERNELGW_TEST_DATABASE_URL=$(bash scripts/ensure-postgres.sh)
  if [ "$pg_ready_before" -eq 0 ]; then
    started_postgres_dir=${KERNELGW_PG_DIR:-/tmp/kernelgw-pg-$pg_port}
  fi
fi
export KERNELGW_TEST_DATABASE_URL
echo "$KERNELGW_TEST_DATABASE_URL"
echo "==> Chromium for the web page tests"
bash scripts/ensure-chromium.sh
echo "==> HAProxy for the many-gateways test"
bash scripts/ensure-haproxy.sh
echo "==> curl and jq for the documentation's examples (tests/integration/test_docs_examples.py)"
if ! command -v curl >/dev/null 2>&1 || ! command -v jq >/dev/null 2>&1; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends curl jq
fi
echo "==> Node, @jupyterlab/services and E2B's JavaScript SDK for their client tests"
bash scripts/ensure-node-clients.sh
echo "==> Enterprise Gateway (its own tool venv) for its GatewayClient's test"
KERNELGW_ENTERPRISE_GATEWAY_PYTHON=$(bash scripts/ensure-enterprise-gateway.sh)
export KERNELGW_ENTERPRISE_GATEWAY_PYTHON
echo "$KERNELGW_ENTERPRISE_GATEWAY_PYTHON"
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1  # Debian's chromium only, never a downloaded browser
mkdir -p test-output

echo "==> static checks"
lint_status=0
bash scripts/lint.sh || lint_status=$?

# pytest's exit status, with "no tests collected" (5) counted as a failure
# (defined before the passes start)
run_pytest() {
  local status=0
  .venv/bin/python -m pytest "$@" || status=$?
  if [ "$status" -eq 5 ]; then
    echo "pytest collected no tests: that is a failure here" >&2
    status=1
  fi
  return "$status"
}

# Pass 2: what depends on the container runtime, with kernels in gVisor: what the
# kernel can reach and do (sandbox, seccomp, limits, signals, files and packages
# through exec, workspace scans, reattaching its sockets) and the adversarial
# suite. Everything else runs in pass 1 only and does not differ by runtime: it is
# the gateway's own logic over the same kernel protocol (history and its storage
# dialects, WebSocket fan-out, SDK, admission, keys, ownership, trust of kernel
# messages, drain, the image build, the web page, agent adapters, crash loops of
# the gateway process).
runsc_tests=(
  tests/integration/test_sandbox.py
  tests/integration/test_seccomp.py
  tests/integration/test_runtime_choice.py
  tests/integration/test_sessions.py
  tests/integration/test_execution.py
  tests/integration/test_timeouts.py
  tests/integration/test_files.py
  tests/integration/test_packages.py
  tests/integration/test_artifacts.py
  tests/integration/test_reattach.py
  tests/integration/test_workspace.py
  tests/integration/test_fork.py
  tests/integration/e2b/test_interpreter.py  # E2B's run_code: interrupts, per-cell env, a paused sandbox's restart
  tests/integration/e2b/test_metrics.py  # E2B's metrics: the engine's stats and the workspace tmpfs of a gVisor sandbox
  tests/integration/e2b/test_pty.py  # E2B's terminal: docker exec -t, resized, its session killed, under gVisor too
  tests/integration/e2b/test_sandbox_end.py  # commands, terminals and watches end with their sandbox: the engine keeps gVisor exec streams open
  tests/security
  -k "not postgres")

# The two passes run at the same time: both mostly wait on containers, and every
# test names its gateways, data directories and containers after its own process,
# so they never meet. Pass 2's output goes to a log, printed when it ends.
# KERNELGW_TEST_SERIAL=1 runs them one after the other instead.
mkdir -p test-output/runsc
runsc_log=test-output/runsc/pytest.log
run_runsc_pass() {
  local status=0
  # its artefacts (notebooks, screenshots) go next to pass 1's, not over them
  KERNELGW_TEST_RUNTIME=runsc KERNELGW_TEST_OUTPUT=test-output/runsc \
    run_pytest -p no:cacheprovider --durations=15 "${runsc_tests[@]}" "$@" || status=$?
  # The unit tests need no engine and no runtime. They ran at the end of pass 1,
  # its long pole (about 4 of its 25 minutes in CI); here they start when the
  # gVisor suites end, around the time the languages pass ends too, so they
  # never make a fourth process on two cores.
  echo "==> the unit tests (no engine), after the gVisor suites"
  KERNELGW_TEST_OUTPUT=test-output/unit run_pytest -p no:cacheprovider --durations=5 tests/unit "$@" ||
    status=$?
  return "$status"
}
# Pass 3: the other languages' kernels, then the deployment check. Their images are built first (on the
# Python image, no network inside; a no-op when up to date: minutes on a fresh
# machine, mostly downloads and dpkg), so this pass runs beside the others
# instead of delaying them. A failed build fails the pass, naming the image.
language_tests=(tests/integration/languages tests/integration/test_languages.py)
mkdir -p test-output/languages
languages_log=test-output/languages/pytest.log
run_languages_pass() {
  echo "==> kernel images of the other languages"
  .venv/bin/kernelgw image build --kernel deno --kernel ir --kernel bash --kernel java --kernel go \
    --kernel cpp --kernel ruby --kernel code-interpreter || return 1
  local status=0
  KERNELGW_TEST_OUTPUT=test-output/languages run_pytest -p no:cacheprovider --durations=10 "${language_tests[@]}" "$@" ||
    status=$?
  # every kernel through the gateway once more, in gVisor, and the Bash kernel's
  # own suite (its interrupts failed there only: gVisor's terminal made no signal
  # of ^C, and does not say its foreground process group)
  echo "==> the languages through the gateway again, kernels on gVisor (runsc)"
  KERNELGW_TEST_RUNTIME=runsc KERNELGW_TEST_OUTPUT=test-output/languages/runsc \
    run_pytest -p no:cacheprovider --durations=5 tests/integration/test_languages.py \
    tests/integration/languages/test_bash.py "$@" || status=$?
  # the deployment as an operator runs it: compose.yaml up (PostgreSQL, the gateway
  # container, HAProxy), sessions through the load balancer, a re-created gateway
  # container, down; after the languages, so its image builds do not delay them
  echo "==> the deployment check (compose.yaml, scripts/check-deploy.sh compose)"
  bash scripts/check-deploy.sh compose || status=$?
  return "$status"
}
languages_status=0
runsc_status=0
if [ "${KERNELGW_TEST_SERIAL:-0}" = 1 ]; then
  echo "==> pytest, pass 1 of 3: every test but the unit and language tests, kernels on runc"
else
  echo "==> pytest, pass 2 of 3 started in the background (kernels on gVisor, runsc; log: $runsc_log)"
  run_runsc_pass "$@" >"$runsc_log" 2>&1 &
  runsc_pid=$!
  echo "==> pass 3 of 3 started in the background (language images, then their kernels; log: $languages_log)"
  run_languages_pass "$@" >"$languages_log" 2>&1 &
  languages_pid=$!
  echo "==> pytest, pass 1 of 3: every test but the unit and language tests, kernels on runc (passes 2 and 3 run beside it)"
fi
runc_status=0
ignored=()
for t in "${language_tests[@]}"; do ignored+=("--ignore=$t"); done
ignored+=(--ignore=tests/unit)  # they run in pass 2 (run_runsc_pass)
KERNELGW_TEST_RUNTIME=runc run_pytest --durations=15 tests "${ignored[@]}" "$@" || runc_status=$?

if [ "${KERNELGW_TEST_SERIAL:-0}" = 1 ]; then
  echo "==> pytest, pass 2 of 3: core integration and adversarial suites, kernels on gVisor (runsc), then the unit tests"
  run_runsc_pass "$@" || runsc_status=$?
  echo "==> pass 3 of 3: the other languages' kernels"
  run_languages_pass "$@" || languages_status=$?
else
  echo "==> pytest, pass 2 of 3: waiting for the gVisor (runsc) pass; its output follows"
  wait "$runsc_pid" || runsc_status=$?
  cat "$runsc_log"
  echo "==> pass 3 of 3: waiting for the languages pass; its output follows"
  wait "$languages_pid" || languages_status=$?
  cat "$languages_log"
fi

echo "==> static checks: $([ "$lint_status" -eq 0 ] && echo passed || echo FAILED);" \
  "runc pass: $([ "$runc_status" -eq 0 ] && echo passed || echo "FAILED (exit $runc_status)");" \
  "runsc pass: $([ "$runsc_status" -eq 0 ] && echo passed || echo "FAILED (exit $runsc_status)");" \
  "languages pass: $([ "$languages_status" -eq 0 ] && echo passed || echo "FAILED (exit $languages_status)")"
if [ "$runc_status" -ne 0 ]; then
  exit "$runc_status"
fi
if [ "$runsc_status" -ne 0 ]; then
  exit "$runsc_status"
fi
if [ "$languages_status" -ne 0 ]; then
  exit "$languages_status"
fi
exit "$lint_status"
