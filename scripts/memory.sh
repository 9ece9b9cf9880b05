#!/usr/bin/env bash
# Resident memory of `jointspace serve` (docs/operations.md, "Memory"): VmRSS and the peak VmHWM after start,
# after ingesting N Flickr8k photos one request each (and how long that took), after 50 sentence searches,
# and 15 s idle. Extra arguments go to `serve`, e.g. `--release-inference-memory false`; the environment is
# passed through (GLIBC_TUNABLES). Needs the release binary and .venv (scripts/serve.sh builds both).
#   N=12 scripts/memory.sh [serve flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-12}
DATA=${DATA:-../shared/data/flickr8k}
BUNDLE=${JOINTSPACE_BUNDLE:-models/flickr8k-vgg16-fne}
PORT=${PORT:-18124}
ORT_DYLIB_PATH=${ORT_DYLIB_PATH:-$(ls "$PWD"/.venv/lib/python3*/site-packages/onnxruntime/capi/libonnxruntime.so.* | head -n 1)}
export ORT_DYLIB_PATH
work=$(mktemp -d)
trap 'kill -TERM "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; rm -rf "$work"' EXIT
target/release/jointspace serve --addr "127.0.0.1:$PORT" --bundle "$BUNDLE" --database-url "sqlite://$work/m.db" \
  --snapshot-interval 0 "$@" >"$work/log" 2>&1 &
pid=$!
until curl -sf "http://127.0.0.1:$PORT/readyz" >/dev/null; do
  kill -0 "$pid" 2>/dev/null || { cat "$work/log"; echo "server died" >&2; exit 1; }
  sleep 0.1
done
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
echo "ingest of $N photos: $(awk "BEGIN { print $t1 - $t0 }") s"
say "after $N photos"
for i in $(seq 50); do
  "${api[@]}" -X POST "http://127.0.0.1:$PORT/v1/collections/c/images/search" \
    -d "{\"text\": \"a dog number $i runs\", \"k\": 3}" >/dev/null
done
say "after 50 searches"
sleep 15
say "idle 15 s later"
