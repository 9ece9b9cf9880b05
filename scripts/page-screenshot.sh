#!/usr/bin/env bash
# The README's picture of the search page (docs/page.png): the default bundle serving the first N photos of the
# Flickr8k test split with their captions (ingested once into .cache/page-screenshot/, ~4 minutes for 120 on
# 2 cores), a sentence searched in chromium.
#
#   scripts/page-screenshot.sh                         # N=120, QUERY="two dogs play in the snow"
#   N=150 QUERY="a man rides a bike" scripts/page-screenshot.sh
# Needs what scripts/serve.sh sets up (.venv, the default bundle's generated files) and chromium + chromium-driver.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-120}
QUERY=${QUERY:-two dogs play in the snow}
DATA=${DATA:-../shared/data/flickr8k}
source scripts/browser-env.sh
scripts/setup-python.sh
cargo build --locked --release --bin jointspace
source scripts/lib.sh
ort_dylib
BUNDLE=$DEFAULT_BUNDLE
bin=${CARGO_TARGET_DIR:-target}/release/jointspace
dir=.cache/page-screenshot
db=$dir/$(basename "$BUNDLE")-flickr8k-test-$N.db   # each bundle its own: a database holds one model's codes
mkdir -p "$dir"
if [[ ! -f $db ]]; then
  head -n "$N" "$DATA/Flickr_8k.testImages.txt" >"$dir/list-$N.txt"
  "$bin" ingest --bundle "$BUNDLE" --database-url "sqlite://$db.partial" --images "$DATA/images" \
    --captions "$DATA/Flickr8k.token.txt" --list "$dir/list-$N.txt" --collection flickr8k-test
  mv "$db.partial" "$db"
  rm -rf "$db.index"
fi
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$bin" serve --addr "127.0.0.1:$port" --bundle "$BUNDLE" --database-url "sqlite://$db" --index-dir "$db.index" \
  --snapshot-interval 0 >"$dir/server.log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true' EXIT
wait_ready "http://127.0.0.1:$port" 120 kill -0 "$pid" || { tail -30 "$dir/server.log"; exit 1; }
"$venv/bin/python" scripts/page_screenshot.py "http://127.0.0.1:$port" flickr8k-test "$QUERY" docs/page.png
