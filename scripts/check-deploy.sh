#!/usr/bin/env bash
# Bring compose.yaml up for real and use it: PostgreSQL, the gateway container
# (host engine through the mounted socket) and HAProxy in front, then a session
# through the load balancer (multi-turn cells, a network-less kernel, listing),
# then (compose) a re-created gateway container that reattaches the session's
# kernel, then down, checking nothing is left on the engine.
#
#   scripts/check-deploy.sh [compose|swarm|all]     (default: compose)
#
# compose: Debian's docker-compose 1.29 (installed when missing), `up -d`.
# swarm:   the same file as a stack (`docker stack deploy`) on a one-node swarm
#          made for the check (`docker swarm init`, left again at the end) when
#          the engine is in none; the gateway runs as a global service.
#
# Images: the kernel image (kernelgw image build, when missing), the gateway image and, since
# no registry may answer, the Debian-based stand-ins for postgres and haproxy
# (kernelgw image build-gateway --stand-ins); each is a no-op when up to date.
# Every name (project, stack, gateway, runtime directory, port) carries this
# process's id, so the check never meets another gateway on the engine.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-compose}
case "$mode" in compose | swarm | all) ;; *)
  echo "usage: $0 [compose|swarm|all]" >&2
  exit 2
  ;;
esac
bin=.venv/bin
# this tree's kernelgw, also where the venv has another checkout installed (worktrees)
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
say() { printf '==> check-deploy: %s\n' "$*" >&2; }
die() {
  say "FAILED: $*"
  exit 1
}

bash scripts/ensure-docker.sh
if ! command -v docker-compose >/dev/null 2>&1 && [ "$mode" != swarm ]; then
  say "installing Debian's docker-compose"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-compose >/dev/null 2>&1 ||
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-compose >/dev/null; }
fi

t0=$(date +%s)
say "images (each skipped when up to date)"
docker image inspect kernelgw/python:latest >/dev/null 2>&1 || "$bin/kernelgw" image build
"$bin/kernelgw" image build-gateway --stand-ins
say "images ready in $(($(date +%s) - t0)) s"

project=kgwcheck$$
export KERNELGW_GATEWAY_NAME=$project
export KERNELGW_RUNTIME_DIR=/tmp/$project
export KERNELGW_POSTGRES_IMAGE=kernelgw/postgres:15
export KERNELGW_LB_IMAGE=kernelgw/haproxy:2.6
export KERNELGW_DB_PASSWORD=check-$RANDOM$RANDOM
export KERNELGW_TOKEN_SECRET=token-$RANDOM$RANDOM
export KERNELGW_CLUSTER_SECRET=cluster-$RANDOM$RANDOM
# keep: a stopped gateway leaves its kernels to its successor (compose checks
# that a re-created container reattaches them); swarm and the end of compose
# use stop, so that taking the deployment down leaves nothing behind
export KERNELGW_ON_SHUTDOWN=keep
export KERNELGW_POOL_SIZE=1
export KERNELGW_LB_PORT=$($bin/python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
url=http://127.0.0.1:$KERNELGW_LB_PORT
mkdir -p "$KERNELGW_RUNTIME_DIR"

say "the load balancer's configuration is valid"
docker run --rm --network none -v "$PWD/deploy/compose/haproxy.cfg:/h.cfg:ro" "$KERNELGW_LB_IMAGE" haproxy -c -f /h.cfg

# leftovers of this check's gateway: containers and volumes by label
leftovers() {
  docker ps -aq --filter "label=kernelgw.gateway=$project"
  docker volume ls -q --filter "label=kernelgw.gateway=$project"
}

# Until the load balancer answers /readyz with 200 three times in a row, a
# second apart: a starting gateway can pass one request (HAProxy retries the
# connection) and fail the next health check, leaving the backend empty for
# a check interval.
wait_ready() {
  local t_start=$(date +%s) ok=0
  say "waiting for $url/readyz (through HAProxy)"
  for _ in $(seq 1 120); do
    if curl -fsS -o /dev/null "$url/readyz" 2>/dev/null; then ok=$((ok + 1)); else ok=0; fi
    if [ "$ok" -ge 3 ]; then
      say "ready after $(($(date +%s) - t_start)) s"
      return 0
    fi
    sleep 1
  done
  say "the load balancer did not answer /readyz with 200 in 120 s; it answers: $(curl -sS "$url/readyz" 2>&1 | head -c 500)"
  return 1
}

# A cell through the load balancer: run CODE in session SID (a new session when
# SID is "new", whose id is printed) and check its result is EXPECTED.
session_cell() {
  KGW_URL=$url KGW_KEY=$key "$bin/python" - "$@" <<'EOF'
import os, sys
import httpx

sid, code, expected = sys.argv[1:4]
headers = {"Authorization": f"Bearer {os.environ['KGW_KEY']}"}
with httpx.Client(base_url=os.environ["KGW_URL"], headers=headers, timeout=60) as http:
    if sid == "new":
        r = http.post("/v1/sessions", json={})
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        print(sid)
    r = http.post(f"/v1/sessions/{sid}/execute", json={"code": code})
    assert r.status_code == 200, r.text
    got = [e["data"]["text/plain"] for e in r.json()["events"] if e["type"] == "result"]
    assert got == ([expected] if expected else []), (got, r.json()["events"])
EOF
}

# The service in use: sessions through the load balancer. $1: how to run a
# command in the gateway's container. Runs as an `if` condition (errexit is
# off there), so each step checks its own result.
exercise() {
  local exec_gateway=$1
  wait_ready || return 1
  local out=""
  key=""
  for _ in 1 2 3 4 5; do
    out=$($exec_gateway kernelgw keys create "check$RANDOM" --admin 2>&1) || true
    key=$(printf '%s\n' "$out" | grep -o 'kgw_[A-Za-z0-9_-]*' | head -n 1) || true
    [ -n "$key" ] && break
    sleep 2
  done
  [ -n "$key" ] || { say "no API key made: $out"; return 1; }
  # the gateway container's hardening is applied (Swarm ignores some options)
  local hardening
  hardening=$($exec_gateway sh -c 'touch /opt/x 2>&1; grep CapEff /proc/self/status')
  say "gateway container: $(printf '%s' "$hardening" | tr '\n' ' ')"
  case "$hardening" in *"Read-only file system"*) ;; *)
    say "the gateway's root file system is writable"
    return 1
    ;;
  esac
  KGW_URL=$url KGW_KEY=$key KGW_GATEWAY=$project "$bin/python" - <<'EOF'
import os, time
import docker, httpx

url, key, name = os.environ["KGW_URL"], os.environ["KGW_KEY"], os.environ["KGW_GATEWAY"]
assert httpx.get(f"{url}/v1/sessions").status_code == 401, "the gateway answered without a key"
with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60) as http:
    t0 = time.monotonic()
    r = http.post("/v1/sessions", json={})
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    print(f"session created through the load balancer in {time.monotonic() - t0:.2f} s")

    def run(code):
        r = http.post(f"/v1/sessions/{sid}/execute", json={"code": code})
        assert r.status_code == 200, r.text
        return r.json()["events"]

    t0 = time.monotonic()
    assert [e["data"]["text/plain"] for e in run("x = 41\nx + 1") if e["type"] == "result"] == ["42"]
    print(f"first cell: {1000 * (time.monotonic() - t0):.0f} ms")
    out = "".join(e["text"] for e in run("print(x * 2)") if e["type"] == "stream")
    assert out == "82\n", out
    out = "".join(e["text"] for e in run(
        "import socket\ntry:\n    socket.create_connection(('1.1.1.1', 53), timeout=2); print('network')\n"
        "except OSError: print('no network')") if e["type"] == "stream")
    assert out == "no network\n", out
    assert sid in [s["id"] for s in http.get("/v1/sessions").json()["sessions"]]
    client = docker.from_env()
    kernels = client.containers.list(filters={"label": [f"kernelgw.gateway={name}", f"kernelgw.session={sid}"]})
    assert kernels and all(k.attrs["HostConfig"]["NetworkMode"] == "none" for k in kernels)
    assert http.delete(f"/v1/sessions/{sid}").status_code == 204
    print("sessions through the load balancer: ok")
EOF
}

check_compose() {
  say "docker-compose up (project $project, load balancer on $url)"
  local compose=(docker-compose -p "$project" -f compose.yaml)
  local t_up=$(date +%s)
  "${compose[@]}" up -d
  trap 'docker-compose -p "$project" -f compose.yaml down -v --timeout 60 >/dev/null 2>&1 || true' EXIT
  diagnose() {
    "${compose[@]}" ps >&2 || true
    "${compose[@]}" logs --no-color --tail 40 gateway lb >&2 || true
    die "$1"
  }
  exercise "${compose[*]} exec -T gateway" || diagnose "compose"
  # A re-created gateway container (a new image, a changed setting) keeps its
  # name (the host's) and reattaches the kernel its predecessor left running:
  # the session's variables are still there.
  local sid
  sid=$(session_cell new "x = 41" "") || diagnose "a session before re-creating the gateway"
  say "re-creating the gateway container (session $sid holds x = 41)"
  "${compose[@]}" up -d --no-deps --force-recreate gateway
  wait_ready || diagnose "the re-created gateway"
  session_cell "$sid" "x + 1" "42" || diagnose "the session did not survive the gateway's re-creation"
  say "the session survived the re-created gateway container"
  # the last gateway removes its kernels when it stops (the first kept them)
  export KERNELGW_ON_SHUTDOWN=stop
  "${compose[@]}" up -d --no-deps gateway
  wait_ready || diagnose "the gateway re-created with on_shutdown=stop"
  say "docker-compose down"
  "${compose[@]}" down -v --timeout 60
  trap - EXIT
  local left
  left=$(leftovers)
  [ -z "$left" ] || die "left behind by compose: $left"
  say "compose: passed in $(($(date +%s) - t_up)) s"
}

check_swarm() {
  export KERNELGW_ON_SHUTDOWN=stop
  local made_swarm=0
  if [ "$(docker info --format '{{.Swarm.LocalNodeState}}')" = inactive ]; then
    say "docker swarm init (a one-node swarm for the check; left again at the end)"
    docker swarm init --advertise-addr 127.0.0.1 >/dev/null
    made_swarm=1
  fi
  local t_up=$(date +%s)
  cleanup_swarm() {
    docker stack rm "$project" >/dev/null 2>&1 || true
    for _ in $(seq 1 60); do
      [ -z "$(docker ps -aq --filter "label=com.docker.stack.namespace=$project")" ] && break
      sleep 1
    done
    docker volume ls -q --filter "label=com.docker.stack.namespace=$project" | xargs -r docker volume rm >/dev/null || true
    if [ "$made_swarm" = 1 ]; then docker swarm leave --force >/dev/null 2>&1 || true; fi
  }
  trap cleanup_swarm EXIT
  say "docker stack deploy (stack $project, load balancer on $url)"
  docker stack deploy --resolve-image never -c compose.yaml "$project"
  local mode
  mode=$(docker service inspect --format '{{if .Spec.Mode.Global}}global{{else}}replicated{{end}}' "${project}_gateway")
  [ "$mode" = global ] || die "the gateway service is $mode, not global"
  gateway_exec() {
    local cid=""
    for _ in $(seq 1 60); do
      cid=$(docker ps -q --filter "label=com.docker.swarm.service.name=${project}_gateway" | head -n 1)
      [ -n "$cid" ] && break
      sleep 1
    done
    docker exec "$cid" "$@"
  }
  if ! exercise gateway_exec; then
    docker service ps --no-trunc "${project}_gateway" >&2 || true
    docker service logs --tail 50 "${project}_gateway" >&2 || true
    die "swarm"
  fi
  cleanup_swarm
  trap - EXIT
  local left
  left=$(leftovers)
  [ -z "$left" ] || die "left behind by the stack: $left"
  say "swarm: passed in $(($(date +%s) - t_up)) s"
}

case "$mode" in
compose) check_compose ;;
swarm) check_swarm ;;
all)
  check_compose
  check_swarm
  ;;
esac
rm -rf "$KERNELGW_RUNTIME_DIR"
say "passed ($mode) in $(($(date +%s) - t0)) s"
