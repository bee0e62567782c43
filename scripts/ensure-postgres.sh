#!/usr/bin/env bash
# A throwaway PostgreSQL server for the tests, on 127.0.0.1 only, and its URL on
# stdout (everything else goes to stderr). Safe to run again: a server already
# answering on the port is reused; the database is created when missing.
#
#   KERNELGW_PG_PORT  port (default 54329)
#   KERNELGW_PG_DIR   cluster directory (default /tmp/kernelgw-pg-$PORT)
#
# Installs Debian's postgresql when no server binaries are found. The cluster
# trusts loopback connections and runs with fsync off: test data only.
set -euo pipefail

PORT=${KERNELGW_PG_PORT:-54329}
DIR=${KERNELGW_PG_DIR:-/tmp/kernelgw-pg-$PORT}
# one database per checkout: two trees (a CI clone beside a working tree) sharing
# the server never meet each other's schema (a newer tree's migration there made
# the older one's tests fail: "Can't locate revision")
DB=${KERNELGW_PG_DB:-kernelgw_test_$(pwd -P | sha256sum | cut -c1-10)}
URL="postgresql+asyncpg://postgres@127.0.0.1:$PORT/$DB"

say() { printf '%s\n' "$*" >&2; }

bindir() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1; }

if [ -z "$(bindir)" ] || [ ! -x "$(bindir)/initdb" ]; then
  say "installing postgresql (Debian package)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq postgresql >&2
fi
BIN=$(bindir)

# As root, the server runs as the postgres user (initdb refuses root).
as_owner() {
  if [ "$(id -u)" -eq 0 ]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

ready() { "$BIN/pg_isready" -q -h 127.0.0.1 -p "$PORT" -U postgres; }

start_cluster() {
  mkdir -p "$DIR"
  if [ "$(id -u)" -eq 0 ]; then chown postgres: "$DIR"; fi
  chmod 700 "$DIR"
  if [ ! -s "$DIR/data/PG_VERSION" ]; then
    say "initdb $DIR/data"
    as_owner "$BIN/initdb" -D "$DIR/data" -U postgres -A trust --no-sync -E UTF8 >"$DIR/initdb.log" 2>&1 \
      || { cat "$DIR/initdb.log" >&2; return 1; }
  fi
  say "starting PostgreSQL on 127.0.0.1:$PORT"
  as_owner "$BIN/pg_ctl" -D "$DIR/data" -l "$DIR/server.log" -w -t 60 \
    -o "-h 127.0.0.1 -p $PORT -k $DIR -c fsync=off -c synchronous_commit=off -c full_page_writes=off" \
    start >&2
}

if ! ready; then
  if ! start_cluster; then
    say "starting failed; a fresh cluster in $DIR"
    as_owner "$BIN/pg_ctl" -D "$DIR/data" -m immediate stop >/dev/null 2>&1 || true
    rm -rf "$DIR"
    start_cluster || { tail -n 30 "$DIR/server.log" >&2 2>/dev/null; exit 1; }
  fi
  for _ in $(seq 1 50); do ready && break; sleep 0.2; done
  ready || { say "PostgreSQL did not answer on port $PORT"; tail -n 30 "$DIR/server.log" >&2; exit 1; }
fi

psql=("$BIN/psql" -h 127.0.0.1 -p "$PORT" -U postgres -v ON_ERROR_STOP=1 -qtA)
if [ "$("${psql[@]}" -d postgres -c "SELECT 1 FROM pg_database WHERE datname = '$DB'")" != "1" ]; then
  "${psql[@]}" -d postgres -c "CREATE DATABASE $DB" >&2
fi
echo "$URL"
