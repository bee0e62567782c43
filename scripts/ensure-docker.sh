#!/usr/bin/env bash
# Make sure a Docker engine answers `docker info`; idempotent.
#
#   scripts/ensure-docker.sh
#
# - Engine already answering: exit 0 at once.
# - Otherwise (needs root): install Debian's docker.io when dockerd is
#   missing, start dockerd in the background with its log in a file, and wait
#   up to DOCKERD_WAIT seconds (default 60) for `docker info`.
# - Also installs debootstrap when missing (kernelgw builds its offline base
#   image with it when no registry is reachable).
#
# Environment:
#   KERNELGW_DOCKERD_LOG  dockerd log file (default /var/log/kernelgw-dockerd.log,
#                         or ${TMPDIR:-/tmp}/kernelgw-dockerd.log if /var/log
#                         is not writable)
#   DOCKERD_WAIT          seconds to wait for the engine (default 60)
set -euo pipefail

say() { printf 'ensure-docker: %s\n' "$*" >&2; }
die() { say "ERROR: $*"; exit 1; }

is_root() { [ "$(id -u)" -eq 0 ]; }

# dockerd and debootstrap live in /usr/sbin, which a non-root PATH may lack.
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"

engine_answers() { docker info >/dev/null 2>&1; }

apt_updated=0
apt_install() {
    is_root || die "'$*' is missing and installing it needs root: run this script as root (sudo $0)"
    command -v apt-get >/dev/null 2>&1 || die "'$*' is missing and this system has no apt-get; install it by hand"
    if [ "$apt_updated" -eq 0 ]; then
        say "apt-get update"
        apt-get update -qq >&2 || die "apt-get update failed"
        apt_updated=1
    fi
    say "apt-get install -y $*"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >&2 \
        || die "apt-get install $* failed"
}

ensure_debootstrap() {
    if command -v debootstrap >/dev/null 2>&1; then
        return 0
    fi
    if is_root; then
        apt_install debootstrap
        say "installed debootstrap"
    else
        say "WARNING: debootstrap is missing (needed to build the offline base image); run as root to install it"
    fi
}

# A pid file is stale unless the pid it names is a live process called $2.
clear_stale_pid_file() {
    local file="$1" name="$2" pid
    [ -f "$file" ] || return 0
    pid="$(cat "$file" 2>/dev/null || true)"
    if [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null || true)" = "$name" ]; then
        return 0
    fi
    say "removing stale $file (pid ${pid:-?} is not a running $name)"
    rm -f "$file"
}

# ------------------------------------------------------------------ main ---

if engine_answers; then
    say "Docker engine already answering ($(docker version --format '{{.Server.Version}}' 2>/dev/null || echo '?'))"
    ensure_debootstrap
    exit 0
fi

if ! command -v docker >/dev/null 2>&1 || ! command -v dockerd >/dev/null 2>&1; then
    # docker.io provides both the engine and (on Debian) the client.
    apt_install docker.io
    say "installed docker.io"
fi
ensure_debootstrap

if ! is_root; then
    die "no Docker engine is answering and starting dockerd needs root. Start it (sudo $0), or check that you may use /var/run/docker.sock (group 'docker')"
fi

if pgrep -x dockerd >/dev/null 2>&1; then
    say "dockerd is running (pid $(pgrep -x dockerd | tr '\n' ' ')) but not answering yet; waiting for it"
else
    log="${KERNELGW_DOCKERD_LOG:-}"
    if [ -z "$log" ]; then
        if [ -w /var/log ]; then
            log=/var/log/kernelgw-dockerd.log
        else
            log="${TMPDIR:-/tmp}/kernelgw-dockerd.log"
        fi
    fi
    # No dockerd is running, so any pid file is stale: left by an engine that
    # died with the machine (a snapshot, a reboot). Its pid may since have been
    # reused by an unrelated process (even this script), so "is that pid alive"
    # is the wrong test: dockerd refuses to start while the file exists.
    clear_stale_pid_file /var/run/docker.pid dockerd
    clear_stale_pid_file /var/run/docker/containerd/containerd.pid containerd
    say "starting dockerd in the background (log: $log)"
    # setsid + nohup: the engine must outlive this script and its session.
    setsid nohup dockerd >>"$log" 2>&1 </dev/null &
    say "dockerd pid $!"
fi

wait_s="${DOCKERD_WAIT:-60}"
for ((i = 0; i < wait_s; i++)); do
    if engine_answers; then
        say "Docker engine answering after ${i}s ($(docker version --format '{{.Server.Version}}' 2>/dev/null || echo '?'))"
        exit 0
    fi
    sleep 1
done
say "Docker engine did not answer within ${wait_s}s; last lines of ${log:-the dockerd log}:"
[ -n "${log:-}" ] && tail -n 20 "$log" >&2 || true
exit 1
