#!/usr/bin/env bash
# Resident memory of `jointspace serve` (docs/operations.md, "Memory"): VmRSS and the peak VmHWM after start,
# after ingesting N Flickr8k photos one request each (and how long that took), after 50 sentence searches,
# 15 s idle, after CONCURRENT photos uploaded at once (their crops share batches of --max-batch-crops: 4 photos
# of ten crops fill a 32-crop batch), and after a query soak of SOAK seconds (4 clients: sentence searches of
# images and captions, and photo searches, which run the CNN), then 15 s idle again. Extra arguments go to
# `serve`, e.g. `--release-inference-memory false`; the environment is passed through (GLIBC_TUNABLES). Needs
# the release binary and .venv (scripts/serve.sh builds both).
#   N=12 CONCURRENT=4 SOAK=120 scripts/memory.sh [serve flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-12}
CONCURRENT=${CONCURRENT:-4}
SOAK=${SOAK:-120}
DATA=${DATA:-../shared/data/flickr8k}
PORT=${PORT:-18124}
source scripts/lib.sh
BUNDLE=${JOINTSPACE_BUNDLE:-$DEFAULT_BUNDLE}
ort_dylib
work=$(mktemp -d)
trap 'kill -TERM "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; rm -rf "$work"' EXIT
target/release/jointspace serve --addr "127.0.0.1:$PORT" --bundle "$BUNDLE" --database-url "sqlite://$work/m.db" \
  --snapshot-interval 0 "$@" >"$work/log" 2>&1 &
pid=$!
wait_ready "http://127.0.0.1:$PORT" 600 kill -0 "$pid" || { cat "$work/log"; exit 1; }
mb() { awk "/$1/ {print int(\$2/1024)}" "/proc/$pid/status"; }
say() { echo "$1: $(mb VmRSS) MB resident (peak $(mb VmHWM) MB)"; }
say start
api=(curl -sf -H 'content-type: application/json')
"${api[@]}" -X POST "http://127.0.0.1:$PORT/v1/collections" -d '{"name":"c"}' >/dev/null
t0=$(date +%s.%N)
for f in $(ls "$DATA/images" | head -n "$N"); do
  printf '{"images":[{"data":"%s","captions":["a photo"]}]}' "$(base64 -w0 "$DATA/images/$f")" >"$work/req.json"
  "${api[@]}" -X POST "http://127.0.0.1:$PORT/v1/collections/c/images" --data @"$work/req.json" >/dev/null
done
t1=$(date +%s.%N)
echo "ingest of $N photos: $(elapsed "$t0" "$t1") s"
say "after $N photos"
for i in $(seq 50); do
  "${api[@]}" -X POST "http://127.0.0.1:$PORT/v1/collections/c/images/search" \
    -d "{\"text\": \"a dog number $i runs\", \"k\": 3}" >/dev/null
done
say "after 50 searches"
sleep 15
say "idle 15 s later"

# Concurrent uploads: their crops are batched together (the largest inference runs the server makes).
mapfile -t more < <(ls "$DATA/images" | sed -n "$((N + 1)),$((N + CONCURRENT))p")
for f in "${more[@]}"; do
  printf '{"images":[{"data":"%s","captions":["a photo"]}]}' "$(base64 -w0 "$DATA/images/$f")" >"$work/$f.json"
done
# With the default --max-queue-wait-ms (2 s) a CPU server refuses (429) a photo that would queue behind
# another, so batches only form when it is raised (JOINTSPACE_MAX_QUEUE_WAIT_MS=60000 in the environment).
uploads=()
for f in "${more[@]}"; do
  curl -s -o /dev/null -w '%{http_code}\n' -H 'content-type: application/json' \
    -X POST "http://127.0.0.1:$PORT/v1/collections/c/images" --data @"$work/$f.json" >"$work/$f.code" &
  uploads+=($!)
done
wait "${uploads[@]}"
echo "$CONCURRENT photos at once: HTTP $(cat "$work"/*.code | sort | uniq -c | awk '{printf "%s x%s ", $2, $1}')"
say "after $CONCURRENT photos at once"
# The soak: 4 clients for SOAK seconds; a photo search costs a ten-crop CNN pass, so it is one request in four.
q=$(ls "$DATA/images" | sed -n 1p)   # sed reads it all: no SIGPIPE under pipefail
printf '{"image":"%s","k":5}' "$(base64 -w0 "$DATA/images/$q")" >"$work/photo.json"
client() {
  local end=$((SECONDS + SOAK)) i=0
  while (( SECONDS < end )); do
    i=$((i + 1))
    case $((i % 4)) in
      0) "${api[@]}" -X POST "http://127.0.0.1:$PORT/v1/collections/c/images/search" --data @"$work/photo.json" >/dev/null ;;
      1) "${api[@]}" -X POST "http://127.0.0.1:$PORT/v1/collections/c/captions/search" -d "{\"text\": \"people at the beach $1 $i\", \"k\": 5}" >/dev/null ;;
      *) "${api[@]}" -X POST "http://127.0.0.1:$PORT/v1/collections/c/images/search" -d "{\"text\": \"a dog $1 runs on grass $i\", \"k\": 10}" >/dev/null ;;
    esac || true
  done
  echo "$i" >"$work/client$1"
}
clients=()
for c in 1 2 3 4; do client "$c" & clients+=($!); done
wait "${clients[@]}"
echo "query soak: $(cat "$work"/client* | awk '{ n += $1 } END { print n }') requests in $SOAK s from 4 clients"
say "after the query soak"
sleep 15
say "idle 15 s later"
