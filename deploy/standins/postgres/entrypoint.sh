#!/bin/sh
# First start: initdb with the password and database the environment names; then Postgres in the foreground
# as user postgres (exec through setpriv, so that it is PID 1 and gets the stop signal).
set -eu
: "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD}"
USER_NAME=${POSTGRES_USER:-postgres}
DB=${POSTGRES_DB:-$USER_NAME}
mkdir -p "$PGDATA" /var/run/postgresql
chown postgres:postgres "$PGDATA" /var/run/postgresql
chmod 700 "$PGDATA"
as_pg() { setpriv --reuid=postgres --regid=postgres --init-groups "$@"; }
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  pw=$(mktemp)
  printf '%s' "$POSTGRES_PASSWORD" > "$pw"
  chown postgres "$pw"
  as_pg initdb -D "$PGDATA" -U "$USER_NAME" --pwfile="$pw" -E UTF8 --auth-local=trust --auth-host=scram-sha-256
  rm -f "$pw"
  echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
  if [ "$DB" != postgres ]; then
    as_pg pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start
    as_pg psql -v ON_ERROR_STOP=1 -U "$USER_NAME" -d postgres -c "CREATE DATABASE \"$DB\""
    as_pg pg_ctl -D "$PGDATA" -m fast -w stop
  fi
fi
exec setpriv --reuid=postgres --regid=postgres --init-groups postgres -D "$PGDATA" -c listen_addresses='*'
