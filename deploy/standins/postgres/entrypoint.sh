#!/bin/sh
# The official postgres image's start-up, reduced to what compose.yaml uses:
# initialise $PGDATA once (user, password, database), listen on every address
# with password authentication, then run the server as the postgres user.
set -eu
if [ "$(id -u)" = 0 ]; then
  mkdir -p "$PGDATA" /run/postgresql
  chown -R postgres:postgres "$PGDATA" /run/postgresql
  chmod 700 "$PGDATA"
  exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  if [ -n "${POSTGRES_PASSWORD_FILE:-}" ]; then POSTGRES_PASSWORD=$(cat "$POSTGRES_PASSWORD_FILE"); fi
  : "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD (or POSTGRES_PASSWORD_FILE)}"
  user=${POSTGRES_USER:-postgres}
  pwfile=$(mktemp)
  printf '%s' "$POSTGRES_PASSWORD" >"$pwfile"
  initdb -D "$PGDATA" -U "$user" --pwfile="$pwfile" -A scram-sha-256 -E UTF8 >/dev/null
  rm -f "$pwfile"
  echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
  echo "listen_addresses = '*'" >>"$PGDATA/postgresql.conf"
  db=${POSTGRES_DB:-$user}
  if [ "$db" != postgres ]; then
    echo "CREATE DATABASE \"$db\" OWNER \"$user\";" | postgres --single -D "$PGDATA" postgres >/dev/null
  fi
  echo "initialised $PGDATA: user $user, database $db" >&2
fi
if [ "${1:-}" = postgres ]; then shift; exec postgres -D "$PGDATA" "$@"; fi
exec "$@"
