#!/usr/bin/env bash
# The open-vocabulary benchmark (docs/results.md, "Open vocabulary"): Debian's tuxpaint-stamps-default, fetched
# by exact version and checked by its sha256 (GPL-2 pictures: kept under .cache/openvocab, never committed;
# scripts/stamps.sh), as a gallery searched through the real server by the first sentence of each stamp's
# description. Usage: scripts/openvocab.sh [bundle...]
#   bundles: default the default bundle (scripts/lib.sh) and models/flickr8k-effnetl2-fne
# For each bundle: a server on a fresh SQLite database; the pictures added through the HTTP API in batches to
# a collection without text fields (searched in vector mode); that collection exported and imported (no CNN:
# the stored codes are projected again) into one with text_fields ["name"] (keyword and hybrid modes); every
# query asked in each mode. Results: .cache/openvocab/results/<bundle>[-<crop mode>].json (and .ranks.jsonl),
# and a table on stdout.
# Environment: OPENVOCAB_LIMIT (only the first N stamps, a quick check), OPENVOCAB_CROP_MODE (the server's
# --crop-mode; default the bundle's), OPENVOCAB_BATCH (pictures per request, 16), OPENVOCAB_PORT (28611),
# OPENVOCAB_QUERIES (all, tune: the even stamps' queries, held-back: the odd ones'; the gallery is whole),
# JOINTSPACE_BIN (target/release/jointspace), ORT_DYLIB_PATH (scripts/lib.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh disable=SC1091
source scripts/lib.sh
# shellcheck source=scripts/stamps.sh disable=SC1091
source scripts/stamps.sh

CACHE=$STAMPS_CACHE
BIN=${JOINTSPACE_BIN:-target/release/jointspace}
PORT=${OPENVOCAB_PORT:-28611}
URL=http://127.0.0.1:$PORT
LIMIT=${OPENVOCAB_LIMIT:-0}
BATCH=${OPENVOCAB_BATCH:-16}
PY=$PWD/.venv/bin/python
[[ -x "$PY" ]] || PY=python3   # needs Pillow
ov() { (cd train && "$PY" -m jointspace_train.evaluation.openvocab "$@"); }
ort_dylib
mkdir -p "$CACHE/results"

# The stamps by exact version, checked, and prepared as a gallery (scripts/stamps.sh).
PY=$PY fetch_stamps
cat "$CACHE/results/prepare.json" 2>/dev/null || true
GALLERY=$STAMPS_GALLERY

SERVER_PID=
stop_server() { # graceful, and only the server this script started
  if [[ -n "$SERVER_PID" ]]; then
    kill -TERM "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" || true
  fi
  SERVER_PID=
}
trap stop_server EXIT

bundles=("$@")
[[ ${#bundles[@]} -eq 0 ]] && bundles=("$DEFAULT_BUNDLE" models/flickr8k-effnetl2-fne)
for bundle in "${bundles[@]}"; do
  name=$(basename "$bundle")${OPENVOCAB_CROP_MODE:+-$OPENVOCAB_CROP_MODE}
  work=$(mktemp -d "${TMPDIR:-/tmp}/openvocab-$name.XXXXXX")
  db="sqlite://$work/ov.db"
  crop=()
  [[ -n "${OPENVOCAB_CROP_MODE:-}" ]] && crop=(--crop-mode "$OPENVOCAB_CROP_MODE")
  "$BIN" serve --addr "127.0.0.1:$PORT" --bundle "$bundle" --database-url "$db" --snapshot-interval 0 \
    "${crop[@]}" >"$work/server.log" 2>&1 &
  SERVER_PID=$!
  wait_ready "$URL" 600 kill -0 "$SERVER_PID" || { cat "$work/server.log"; exit 1; }
  echo "== $name (server log: $work/server.log; kept as $CACHE/results/$name.server.log)" >&2

  # The photos go through the CNN once, into the collection without text fields ...
  ov ingest --url "$URL" --manifest "$PWD/$GALLERY/manifest.jsonl" --limit "$LIMIT" --batch "$BATCH" \
    --collection ov-plain | tee "$work/ingest.json"
  # ... and into the named one by export and import: the same codes and metadata, the keyword text written
  # under that collection's text fields.
  curl -fsS "$URL/v1/collections/ov-plain/export" >"$work/plain.jsonl"
  curl -fsS -X POST "$URL/v1/collections" -H 'content-type: application/json' \
    -d '{"name": "ov-named", "description": "tuxpaint stamps, name as a product title", "text_fields": ["name"]}' >/dev/null
  "$BIN" import "$work/plain.jsonl" --collection ov-named --bundle "$bundle" --database-url "$db" "${crop[@]}" \
    >"$work/import.log" 2>&1 || { cat "$work/import.log"; exit 1; }
  want=$(grep -c '"image"' "$work/plain.jsonl")
  # The server follows the import through the database's change sequence (every 500 ms): wait until its
  # index of the named collection holds every picture.
  have=0
  for _ in $(seq 600); do
    have=$(curl -fsS -X POST "$URL/v1/collections/ov-named/images/search" -H 'content-type: application/json' \
      -d "{\"text\": \"a picture\", \"k\": $want, \"mode\": \"vector\"}" \
      | "$PY" -c 'import json,sys; print(len(json.load(sys.stdin)["results"]))')
    [[ "$have" == "$want" ]] && break
    sleep 0.1
  done
  [[ "$have" == "$want" ]] || { echo "ov-named: $have images in the server's index, $want imported" >&2; exit 1; }
  wait_ready "$URL" 60 kill -0 "$SERVER_PID"

  ov measure --url "$URL" --manifest "$PWD/$GALLERY/manifest.jsonl" --limit "$LIMIT" --plain ov-plain \
    --named ov-named --queries "${OPENVOCAB_QUERIES:-all}" --ranks "$PWD/$CACHE/results/$name.ranks.jsonl" >"$work/measure.json"
  "$PY" - "$work/ingest.json" "$work/measure.json" "$(cut -d' ' -f1-3 /proc/loadavg)" >"$CACHE/results/$name.json" <<'EOF'
import json, sys
out = json.load(open(sys.argv[2]))
out["ingest"] = json.load(open(sys.argv[1]))
out["loadavg_after"] = sys.argv[3]
print(json.dumps(out, ensure_ascii=False))
EOF
  stop_server
  cp "$work/server.log" "$CACHE/results/$name.server.log"
  rm -rf "$work"   # the database and its snapshots (about 24 MB); a failed run leaves them for a look
done

# The table of docs/results.md, from every bundle's results.
"$PY" - "${OPENVOCAB_CROP_MODE:-}" "${bundles[@]}" <<'EOF'
import json, sys
print("| bundle | mode | R@1 | R@5 | R@10 | median rank | queries with an unknown word | gallery |")
print("|---|---|---|---|---|---|---|---|")
for b in sys.argv[2:]:
    name = b.rstrip("/").rsplit("/", 1)[-1] + (f"-{sys.argv[1]}" if sys.argv[1] else "")
    r = json.load(open(f".cache/openvocab/results/{name}.json"))
    for mode, m in r["modes"].items():
        unknown = f"{r['queries_with_unknown_word']} of {r['queries']} ({r['unknown_share']}%)" if mode == "vector" else ""
        print(f"| {name} ({r['crop_mode']}) | {mode} | {m['r@1']} | {m['r@5']} | {m['r@10']} | "
              f"{m['median_rank'] if m['median_rank'] is not None else 'not returned'} | {unknown} | {r['gallery']} |")
EOF
