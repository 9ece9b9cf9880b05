#!/usr/bin/env bash
# Soak test: the release server under a mixed load of ingest and search for SOAK_SECONDS (default 600),
# sampling its RSS every 10 s. Fails on any error (5xx, 4xx other than 429, connection failure) or when memory
# keeps growing: the RSS at the end may exceed the RSS after warm-up by at most SOAK_RSS_GROWTH_MB (64).
# The ingest side cycles collections (create, add Flickr8k photos with captions, search them, delete), so the
# data held stays bounded and a growing RSS means a leak; the search side queries a fixed base collection.
#
#   scripts/soak.sh                                   # default bundle, 10 minutes
#   SOAK_SECONDS=120 JOINTSPACE_BUNDLE=models/fixture-tiny scripts/soak.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export SOAK_SECONDS=${SOAK_SECONDS:-600}
export SOAK_DATA=${SOAK_DATA:-../shared/data/flickr8k}
bundle=${JOINTSPACE_BUNDLE:-models/flickr8k-vgg16-fne}
scripts/setup-python.sh
ORT_DYLIB_PATH=${ORT_DYLIB_PATH:-$(ls "$PWD"/.venv/lib/python3*/site-packages/onnxruntime/capi/libonnxruntime.so.* | head -n 1)}
export ORT_DYLIB_PATH
cargo build --locked --release --bin jointspace
bin=${CARGO_TARGET_DIR:-target}/release/jointspace
work=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$bin" serve --addr "127.0.0.1:$port" --bundle "$bundle" --database-url "sqlite://$work/js.db" \
  --snapshot-interval 60 >"$work/server.log" 2>&1 &
pid=$!
cleanup() { kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
for _ in $(seq 240); do curl -fsS "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break; sleep 0.5; done
status=0
python3 scripts/soak.py "http://127.0.0.1:$port" "$pid" || status=$?
grep -q '"request failed"\|request failed' "$work/server.log" && { echo "server logged errors:"; grep 'request failed' "$work/server.log" | head; status=1; }
kill -0 "$pid" || { echo "the server died"; tail -30 "$work/server.log"; status=1; }
exit $status
