#!/usr/bin/env bash
# Two builds of the server side by side, interleaved so that a change in the machine's load hits both alike:
# ingest (`jointspace ingest` of N Flickr8k test photos, the VGG16 bundle unless BENCH_BUNDLE) and sentence search (`bench load`,
# 8 clients for 10 s, on a 10,000-image collection seeded with synthetic codes). One JSON line per run.
#
#   scripts/ab-bench.sh OLD_BINARY NEW_BINARY [REPS]      # e.g. a worktree of the old commit's target/release/jointspace
#
# Environment: BENCH_DATA (Flickr8k folder), BENCH_BUNDLE, AB_PHOTOS (24), AB_PORT (28999).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
ort_dylib
OLD=$1 NEW=$2 REPS=${3:-3}
DATA=${BENCH_DATA:-../shared/data/flickr8k}
BUNDLE=${BENCH_BUNDLE:-models/flickr8k-vgg16-fne}
PORT=${AB_PORT:-28999}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
head -n "${AB_PHOTOS:-24}" "$DATA/Flickr_8k.testImages.txt" >"$W/list"
cargo bench -q --locked --bench bench --no-run
bench() { cargo bench -q --locked --bench bench -- "$@"; }
for rep in $(seq "$REPS"); do
  for v in old new; do
    bin=$OLD; [[ $v == new ]] && bin=$NEW
    rm -f "$W/$v.db"*
    t0=$(date +%s.%N)
    "$bin" ingest --images "$DATA/images" --list "$W/list" --captions "$DATA/Flickr8k.token.txt" --collection c \
      --database-url "sqlite://$W/$v.db" --bundle "$BUNDLE" >/dev/null 2>"$W/ingest.log"
    t1=$(date +%s.%N)
    echo "{\"what\": \"ingest\", \"v\": \"$v\", \"rep\": $rep, \"photos\": $(wc -l <"$W/list"), \"s\": $(elapsed "$t0" "$t1"), \"loadavg\": \"$(cut -d' ' -f1-3 /proc/loadavg)\"}"
  done
done
bench seed --database-url "sqlite://$W/seed.db" --bundle "$BUNDLE" --sizes 10000 >/dev/null
for rep in $(seq "$REPS"); do
  for v in old new; do
    bin=$OLD; [[ $v == new ]] && bin=$NEW
    rm -rf "$W/run"; mkdir -p "$W/run"; cp "$W/seed.db" "$W/run/"
    "$bin" serve --addr "127.0.0.1:$PORT" --bundle "$BUNDLE" --database-url "sqlite://$W/run/seed.db" \
      --snapshot-interval 0 >"$W/serve.log" 2>&1 &
    pid=$!
    wait_ready "http://127.0.0.1:$PORT" 300 kill -0 "$pid" || { cat "$W/serve.log"; exit 1; }
    bench load --url "http://127.0.0.1:$PORT/v1/collections/n10000/images/search" --query text \
      --texts "$DATA/Flickr8k.token.txt" --concurrency 8 --seconds 10 --server-pid "$pid" \
      | python3 -c 'import json,sys; r=json.load(sys.stdin); r.update(what="search", v=sys.argv[1], rep=int(sys.argv[2])); print(json.dumps(r))' "$v" "$rep"
    kill -TERM "$pid"; wait "$pid" || true
  done
done
