#!/usr/bin/env bash
# Make sure the Docker engine can run containers with gVisor (`--runtime runsc`);
# idempotent. Run after scripts/ensure-docker.sh (the engine must answer).
#
#   scripts/ensure-runsc.sh
#
# - Installs Debian's runsc package when no runsc binary is found (needs root).
# - Registers it in the engine's daemon.json as the runtime "runsc" with the
#   arguments kernelgw needs, merged into whatever the file already holds
#   (other keys, other runtimes and other runsc arguments are kept):
#     --network=none     containers on the default bridge do not start without it
#     --host-uds=create  lets the kernel create its ipc:// sockets in the
#                        bind-mounted connection directory
#   Not --oci-seccomp (runsc 20221219), which would apply the seccomp profile
#   inside the sandbox too (unshare, chroot, ptrace, io_uring failing as under
#   runc): with it the profile's rules misfire in gVisor. clone3 got EPERM, not
#   the rule's ENOSYS (no thread started; kernelgw now allows clone3 for runsc,
#   gVisor has none), and pselect6, which the profile allows, fails with EPERM:
#   the Bash kernel (pexpect's select) does not start, Ruby and R fail tests.
#   So under gVisor the profile is not applied and gVisor's own kernel is the
#   boundary (docs/security.md says what holds there).
#   The file is rewritten and dockerd reloaded (SIGHUP) only when that changed
#   something, or when the engine does not list the runtime yet.
# - Checks that `docker info` lists the runtime with those arguments, then runs
#   the kernel image once with it (`docker run --rm --runtime runsc IMAGE true`).
#
# Environment:
#   KERNELGW_IMAGE         image of the smoke test (default kernelgw/python:latest)
#   KERNELGW_DAEMON_JSON   the engine's configuration file (default /etc/docker/daemon.json)
#   RUNSC_WAIT             seconds to wait for the engine to list runsc after a reload (default 30)
#   RUNSC_SMOKE_TIMEOUT    seconds the smoke-test container may take (default 120)
set -euo pipefail

say() { printf 'ensure-runsc: %s\n' "$*" >&2; }
die() { say "ERROR: $*"; exit 1; }

is_root() { [ "$(id -u)" -eq 0 ]; }

export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"

IMAGE=${KERNELGW_IMAGE:-kernelgw/python:latest}
DAEMON_JSON=${KERNELGW_DAEMON_JSON:-/etc/docker/daemon.json}
REQUIRED_ARGS='["--network=none", "--host-uds=create"]'

docker info >/dev/null 2>&1 || die "no Docker engine answers; run scripts/ensure-docker.sh first"

# True when `docker info` lists runsc with every required argument.
engine_has_runsc() {
    docker info --format '{{json .Runtimes}}' 2>/dev/null | REQUIRED_ARGS="$REQUIRED_ARGS" python3 -c '
import json, os, sys
try:
    runtimes = json.load(sys.stdin) or {}
except ValueError:
    sys.exit(1)
entry = runtimes.get("runsc")
args = (entry or {}).get("runtimeArgs") or []
sys.exit(0 if entry and all(a in args for a in json.loads(os.environ["REQUIRED_ARGS"])) else 1)
'
}

# --------------------------------------------------------------- the binary ---

runsc_path=$(command -v runsc || true)
if [ -z "$runsc_path" ]; then
    is_root || die "runsc (gVisor) is missing and installing it needs root: run this script as root (sudo $0)"
    command -v apt-get >/dev/null 2>&1 || die "runsc is missing and this system has no apt-get; install gVisor by hand (https://gvisor.dev/docs/user_guide/install/)"
    say "apt-get update"
    apt-get update -qq >&2 || die "apt-get update failed"
    say "apt-get install -y runsc"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq runsc >&2 || die "apt-get install runsc failed"
    runsc_path=$(command -v runsc) || die "runsc was installed but is not on PATH"
    say "installed runsc ($runsc_path)"
fi
say "runsc: $runsc_path ($("$runsc_path" --version 2>/dev/null | head -n 1 || echo 'version unknown'))"

# ------------------------------------------------------- daemon.json entry ---

# Prints "changed" or "unchanged"; writes the file (atomically) only when changed.
merge_daemon_json() {
    RUNSC_PATH="$runsc_path" REQUIRED_ARGS="$REQUIRED_ARGS" DAEMON_JSON="$DAEMON_JSON" python3 -c '
import json, os, sys, tempfile

path = os.environ["DAEMON_JSON"]
required = json.loads(os.environ["REQUIRED_ARGS"])
try:
    with open(path) as f:
        text = f.read()
except FileNotFoundError:
    text = ""
try:
    config = json.loads(text) if text.strip() else {}
except ValueError as exc:
    sys.exit(f"{path} is not valid JSON ({exc}); fix it by hand, nothing was changed")
if not isinstance(config, dict):
    sys.exit(f"{path} does not hold a JSON object; fix it by hand, nothing was changed")

runtimes = config.setdefault("runtimes", {})
if not isinstance(runtimes, dict):
    sys.exit(f"\"runtimes\" in {path} is not an object; fix it by hand, nothing was changed")
entry = dict(runtimes.get("runsc") or {})
# Keep the arguments someone else set, except other values of the flags we set.
flag = lambda arg: arg.split("=", 1)[0]
ours = {flag(a) for a in required}
kept = [a for a in entry.get("runtimeArgs") or [] if flag(a) not in ours]
want = dict(entry, path=entry.get("path") or os.environ["RUNSC_PATH"], runtimeArgs=kept + required)
if not os.path.exists(want["path"]):
    want["path"] = os.environ["RUNSC_PATH"]
if runtimes.get("runsc") == want:
    print("unchanged")
    sys.exit(0)
runtimes["runsc"] = want
os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=".daemon.json.")
with os.fdopen(fd, "w") as f:
    json.dump(config, f, indent=2)
    f.write("\n")
os.chmod(tmp, 0o644)
os.replace(tmp, path)
print("changed")
'
}

reload_dockerd() {
    local pid=""
    if [ -f /var/run/docker.pid ] && kill -0 "$(cat /var/run/docker.pid 2>/dev/null)" 2>/dev/null; then
        pid=$(cat /var/run/docker.pid)
    else
        pid=$(pgrep -x dockerd | head -n 1 || true)
    fi
    [ -n "$pid" ] || die "$DAEMON_JSON was updated but no local dockerd process was found to reload; restart the engine by hand"
    say "reloading dockerd (SIGHUP to pid $pid)"
    kill -HUP "$pid"
}

# As root the file is brought up to date even when the engine already lists
# runsc: a registration that lives only in the running engine (the file edited
# since, SIGHUP does not drop runtimes a file no longer names) would be lost at
# its next start.
reloaded=0
if is_root; then
    result=$(merge_daemon_json) || die "could not update $DAEMON_JSON"
    if [ "$result" = changed ]; then
        say "registered runsc in $DAEMON_JSON"
        reload_dockerd
        reloaded=1
    else
        say "$DAEMON_JSON already registers runsc with ${REQUIRED_ARGS}"
    fi
fi
if ! engine_has_runsc && [ "$reloaded" -eq 0 ]; then
    is_root || die "the engine does not list runsc with ${REQUIRED_ARGS} and changing $DAEMON_JSON needs root: run this script as root (sudo $0)"
    # the file is right but the engine has not read it
    reload_dockerd
    reloaded=1
fi
if [ "$reloaded" -eq 1 ]; then
    wait_s="${RUNSC_WAIT:-30}"
    for ((i = 0; ; i++)); do
        engine_has_runsc && break
        [ "$i" -lt "$wait_s" ] || die "the engine does not list runsc with ${REQUIRED_ARGS} ${wait_s}s after the reload: $(docker info --format '{{json .Runtimes}}' 2>&1); is dockerd reading $DAEMON_JSON? See its log"
        sleep 1
    done
    say "the engine lists runsc after ${i}s"
else
    say "the engine already lists runsc with ${REQUIRED_ARGS}"
fi
say "docker info runtimes: $(docker info --format '{{json .Runtimes}}')"

# ------------------------------------------------------------- smoke test ---

docker image inspect "$IMAGE" >/dev/null 2>&1 \
    || die "image $IMAGE is missing, so runsc cannot be smoke-tested; build it first (scripts/setup.sh or kernelgw image build)"
say "smoke test: docker run --rm --runtime runsc $IMAGE true"
start=$(date +%s.%N)
smoke="kgw-runsc-smoke-$$"
if ! timeout "${RUNSC_SMOKE_TIMEOUT:-120}" docker run --rm --name "$smoke" --runtime runsc "$IMAGE" true; then
    docker rm -f "$smoke" >/dev/null 2>&1 || true
    die "a container did not run with --runtime runsc (see the dockerd log; --platform=kvm hangs on some machines, the default ptrace platform works)"
fi
say "runsc runs $IMAGE ($(python3 -c "import time; print(f'{time.time() - $start:.1f}')")s)"
