#!/usr/bin/env bash
# The benchmarks of docs/benchmarks.md. Usage: scripts/bench.sh [section...]
#   sections: machine ingest projection index query overload (default: all of them, in that order)
# Results: one JSON object per line in target/bench/results.jsonl (each with the load average at the time:
# this machine may be shared), and the server's logs in target/bench/*.log. Measures the VGG16 bundle
# (models/flickr8k-vgg16-fne: the figures in docs/benchmarks.md are its, and torch's side of the comparison runs
# VGG16) unless BENCH_BUNDLE names another. Needs it set up (scripts/setup-python.sh), the Flickr8k images
# (BENCH_DATA) and, for the wrk cross-check, wrk.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=target/bench
mkdir -p "$OUT"
RESULTS=$OUT/results.jsonl
DATA=${BENCH_DATA:-/work/shared/data/flickr8k}
BUNDLE=${BENCH_BUNDLE:-models/flickr8k-vgg16-fne}
THREADS=${BENCH_THREADS:-2}
REPS=${BENCH_REPS:-2}
N_CENTER=${BENCH_N_CENTER:-16}
N_TEN=${BENCH_N_TEN:-6}
SIZES=${BENCH_SIZES:-10000,100000}
SECONDS_PER_RUN=${BENCH_SECONDS:-10}
PORT=${BENCH_PORT:-28517}
PY=$PWD/.venv/bin/python
source scripts/lib.sh
ort_dylib
export OPENBLAS_NUM_THREADS=$THREADS OMP_NUM_THREADS=$THREADS

cargo build -q --release --locked
cargo bench -q --locked --bench bench --no-run
bench() { cargo bench -q --locked --bench bench -- "$@"; }
pybench() { (cd train && "$PY" -m jointspace_train.evaluation.bench "$@"); }
# Appends a result (a JSON object on stdin) to the results, tagged with a label.
record() {
  "$PY" -c 'import json,sys; r=json.load(sys.stdin); r["label"]=sys.argv[1]; print(json.dumps(r))' "$1" | tee -a "$RESULTS"
}

machine() {
  "$PY" - <<'EOF' | record machine
import json, os, subprocess, datetime
cpu = [l.split(":", 1)[1].strip() for l in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines() if l.startswith("Model name")]
mem = [l.split()[1] for l in open("/proc/meminfo") if l.startswith("MemTotal")]
print(json.dumps({"bench": "machine", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  "cpu": cpu[0] if cpu else "?", "cores": os.cpu_count(), "mem_gib": round(int(mem[0]) / 2**20, 1),
                  "loadavg": " ".join(open("/proc/loadavg").read().split()[:3]),
                  "rustc": subprocess.run(["rustc", "--version"], capture_output=True, text=True).stdout.strip()}))
EOF
}

ingest() {
  pybench check --bundle "../$BUNDLE" --images "$DATA/images" | record torch-vs-ort
  # Interleaved: the three contenders on the same images, one after another, REPS times, so that a change
  # in the machine's load hits all three alike.
  for rep in $(seq "${BENCH_REP_START:-1}" $((${BENCH_REP_START:-1} + REPS - 1))); do
    # The machine's FLOP rate under the same load as this round's inference.
    pybench sgemm --bundle "../$BUNDLE" --threads "$THREADS" | record "sgemm-$rep"
    for mode in center ten; do
      n=$N_CENTER; [ "$mode" = ten ] && n=$N_TEN
      bench ingest --bundle "$BUNDLE" --images "$DATA/images" --n "$n" --crop "$mode" --threads "$THREADS" | record "ingest-server-$mode-$rep"
      pybench ingest --framework ort --bundle "../$BUNDLE" --images "$DATA/images" --n "$n" --crop "$mode" --threads "$THREADS" | record "ingest-ort-$mode-$rep"
      pybench ingest --framework torch --bundle "../$BUNDLE" --images "$DATA/images" --n "$n" --crop "$mode" --threads "$THREADS" | record "ingest-torch-$mode-$rep"
    done
  done
}

projection() {
  bench projection --bundle "$BUNDLE" --codes 200 | record projection
  bench hubness --bundle "$BUNDLE" | record hubness   # the offset that follows the projection
}

index() {
  # The graph is built here (slow at 100k on two cores); the query section also measures the served 100k graph.
  for n in ${BENCH_INDEX_SIZES:-10000}; do
    bench index --n "$n" --dim 1024 --queries 200 --ef 64,128,256 | record "index-$n"
  done
}

SERVER_PID=
DB=$OUT/query.db
start_server() { # $1: database path, $2: label; records the time to /readyz and the resident memory
  local t0 t1
  t0=$(date +%s.%N)
  target/release/jointspace serve --addr "127.0.0.1:$PORT" --bundle "$BUNDLE" --database-url "sqlite://$1" \
    --intra-threads "$THREADS" --snapshot-interval 0 >"$OUT/$2.log" 2>&1 &
  SERVER_PID=$!
  wait_ready "http://127.0.0.1:$PORT" 600 kill -0 "$SERVER_PID" || { cat "$OUT/$2.log"; exit 1; }
  t1=$(date +%s.%N)
  local rss
  rss=$(awk '/VmRSS/ {print $2 * 1024}' "/proc/$SERVER_PID/status")
  echo "{\"bench\": \"start\", \"ready_s\": $(elapsed "$t0" "$t1"), \"rss_bytes\": $rss, \"loadavg\": \"$(cut -d' ' -f1-3 /proc/loadavg)\"}" | record "$2"
}
stop_server() { # graceful: the server writes its index snapshots on SIGTERM
  [ -n "$SERVER_PID" ] && kill -TERM "$SERVER_PID" && wait "$SERVER_PID" || true
  SERVER_PID=
}
trap stop_server EXIT

seed() {
  bench seed --database-url "sqlite://$DB" --bundle "$BUNDLE" --sizes "$SIZES" | record seed
}

query() {
  # Cold start with the default bundle and an empty database.
  rm -rf "$OUT/empty"
  mkdir -p "$OUT/empty"
  start_server "$OUT/empty/empty.db" start-empty
  stop_server
  seed
  # Building the graphs at start (no snapshot) takes many minutes at 100k: only when asked, or the first time.
  if [ -n "${BENCH_BUILD_START:-}" ] || [ ! -f "$OUT/index/c2-images.json" ]; then
    rm -rf "$OUT/index"
    start_server "$DB" start-seeded-build    # indexes built from the database
    stop_server                              # snapshots written
  fi
  start_server "$DB" start-seeded-snapshot   # indexes loaded from the snapshots
  local base=http://127.0.0.1:$PORT/v1/collections first=1
  local big=${SIZES##*,}
  # The goal's operating point: a fixed 200 requests/s (open loop), four runs in a row (p99 and the server's CPU
  # per request each), the first one right after the start.
  for run in 1 2 3 4; do
    bench load --url "$base/n$big/images/search" --query text --texts "$DATA/Flickr8k.token.txt" \
      --rate 200 --seconds 20 --server-pid "$SERVER_PID" | record "text-to-image-n$big-rate200-run$run"
  done
  for n in ${SIZES//,/ }; do
    for c in 1 8 32 128; do
      bench load --url "$base/n$n/images/search" --query text --texts "$DATA/Flickr8k.token.txt" \
        --concurrency "$c" --seconds "$SECONDS_PER_RUN" --server-pid "$SERVER_PID" | record "text-to-image-n$n-c$c"
      bench load --url "$base/n$n/captions/search" --query image_id --ids "$n" --first-id "$first" \
        --concurrency "$c" --seconds "$SECONDS_PER_RUN" --server-pid "$SERVER_PID" | record "image-to-caption-n$n-c$c"
    done
    first=$((first + n))
  done
  if command -v wrk >/dev/null; then
    # Cross-check of the closed-loop numbers with wrk (one sentence).
    wrk -t1 -c8 -d"${SECONDS_PER_RUN}s" --latency -s benches/wrk-search.lua "$base/n$big/images/search" \
      | tee "$OUT/wrk-n$big-c8.txt"
  fi
  stop_server
  # Recall@10 of the graph the server just served (its snapshot), against the exact ranking (with the offsets).
  bench index --n "$big" --dim 1024 --queries 200 --ef 64,128,256 --database-url "sqlite://$DB" \
    --index-dir "$OUT/index" --bundle "$BUNDLE" | record "index-served-$big"
}

overload() {
  # Past saturation: open-loop load at twice and four times what 32 closed-loop clients got through, on the
  # largest index. A server that sheds load answers 429 fast; one that queues shows p50 rising over the run.
  [ -f "$DB" ] || seed
  start_server "$DB" start-overload
  local big=${SIZES##*,}
  local url=http://127.0.0.1:$PORT/v1/collections/n$big/images/search
  bench load --url "$url" --query text --texts "$DATA/Flickr8k.token.txt" --concurrency 32 \
    --seconds "$SECONDS_PER_RUN" --server-pid "$SERVER_PID" >"$OUT/saturation.json"
  record overload-text-saturation <"$OUT/saturation.json"
  local sat
  sat=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["throughput_ok_per_s"])' "$OUT/saturation.json")
  for x in 2 4; do
    bench load --url "$url" --query text --texts "$DATA/Flickr8k.token.txt" \
      --rate "$("$PY" -c "print(round($sat * $x))")" --seconds "$SECONDS_PER_RUN" --server-pid "$SERVER_PID" \
      | record "overload-text-x$x"
  done
  # The expensive path, the one an inference queue fills with: searches by an uploaded photo (the CNN runs
  # for each), at a rate well past what two cores embed.
  local imgs=("$DATA"/images/*)
  local img=${imgs[0]}
  bench load --url "$url" --query image --image "$img" --concurrency 2 --seconds "$SECONDS_PER_RUN" \
    --server-pid "$SERVER_PID" >"$OUT/saturation-image.json"
  record overload-image-saturation <"$OUT/saturation-image.json"
  sat=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["throughput_ok_per_s"])' "$OUT/saturation-image.json")
  bench load --url "$url" --query image --image "$img" \
    --rate "$("$PY" -c "print(max(round($sat * 4, 1), 1.0))")" --seconds "$SECONDS_PER_RUN" \
    --server-pid "$SERVER_PID" | record overload-image-x4
  stop_server
}

sections=("$@")
[ ${#sections[@]} -eq 0 ] && sections=(machine ingest projection index query overload)
for s in "${sections[@]}"; do
  case $s in
    machine | ingest | projection | index | query | overload | seed) "$s" ;;
    *) echo "unknown section $s" >&2; exit 2 ;;
  esac
done
