#!/usr/bin/env bash
# A searchable catalogue one command away: sets up as scripts/serve.sh does, serves the default bundle, and loads
# a real set of named pictures into the collection `demo` through the catalogue feed (`jointspace sync`): the
# stamps of Debian's tuxpaint-stamps-default, fetched by exact version and checked (scripts/stamps.sh; GPL-2,
# kept under .cache/, never committed), each with its name, its description (also its caption), its category
# and its licence as metadata. Then it prints the search page's address and three example searches, and keeps
# serving until Ctrl-C.
#
#   scripts/demo.sh             all 785 stamps (embedded once: 7.4 minutes on 2 busy cores; a rerun is ready in 10 s)
#   scripts/demo.sh --check     CI: a scratch database, the searches asked and checked, then the server stopped
#
# Environment: DEMO_STAMPS (how many stamps, spread over the categories; default all), JOINTSPACE_ADDR
# (127.0.0.1:8080), DEMO_DATABASE_URL (sqlite://data/demo.db; with --check a scratch one), JOINTSPACE_BUNDLE
# (the default, scripts/lib.sh), JOINTSPACE_BIN (a built binary: set-up and the build are skipped).
# A rerun is quick: the sync finds every stamp already in step and embeds nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
check=false
[[ "${1:-}" == "--check" ]] && check=true
started=$SECONDS

if [[ -z "${JOINTSPACE_BIN:-}" ]]; then
  scripts/setup-python.sh
  cargo build --locked --release --bin jointspace
fi
BIN=${JOINTSPACE_BIN:-${CARGO_TARGET_DIR:-target}/release/jointspace}
# shellcheck source=scripts/lib.sh disable=SC1091
source scripts/lib.sh
# shellcheck source=scripts/stamps.sh disable=SC1091
source scripts/stamps.sh
ort_dylib
PY=$PWD/.venv/bin/python
[[ -x "$PY" ]] || PY=python3

export JOINTSPACE_ADDR=${JOINTSPACE_ADDR:-127.0.0.1:8080}
export JOINTSPACE_BUNDLE=${JOINTSPACE_BUNDLE:-$DEFAULT_BUNDLE}
# glibc unmaps buffers of 4 MiB and more when freed (docs/operations.md, "Memory").
export GLIBC_TUNABLES=${GLIBC_TUNABLES:-glibc.malloc.mmap_threshold=4194304}
scratch=
if $check && [[ -z "${DEMO_DATABASE_URL:-}" ]]; then
  scratch=$(mktemp -d "${TMPDIR:-/tmp}/demo.XXXXXX")
  DEMO_DATABASE_URL=sqlite://$scratch/demo.db
fi
mkdir -p data
export JOINTSPACE_DATABASE_URL=${DEMO_DATABASE_URL:-sqlite://data/demo.db}
URL=http://$JOINTSPACE_ADDR
LOG=${scratch:-data}/demo-server.log

# The stamps, fetched and prepared once (161 MB, into .cache/openvocab).
PY=$PY fetch_stamps
FEED=$STAMPS_GALLERY/demo-feed.jsonl
"$PY" - "$STAMPS_GALLERY/manifest.jsonl" "${DEMO_STAMPS:-0}" "$STAMPS_VERSION" >"$FEED" <<'EOF'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1], encoding="utf-8")]
n = int(sys.argv[2]) or len(rows)
n = min(n, len(rows))
# Spread over the whole gallery (it is in category order), so that a few stamps are not all one kind of thing.
picked = [rows[i * len(rows) // n] for i in range(n)]
licence = f"GPL-2.0-or-later: Tux Paint stamps, Debian tuxpaint-stamps-default {sys.argv[3]} (COPYRIGHT beside the pictures)"
for r in picked:
    print(json.dumps({"id": r["external_id"], "image": r["file"], "name": r["name"], "description": r["description"],
                      "category": r["category"], "licence": licence}, ensure_ascii=False))
EOF
count=$(wc -l <"$FEED")

SERVER_PID=
stop_server() { # graceful, and only the server this script started
  if [[ -n "$SERVER_PID" ]]; then
    kill -TERM "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
  fi
  SERVER_PID=
  [[ -z "$scratch" ]] || rm -rf "$scratch"
}
trap stop_server EXIT
trap 'exit 130' INT TERM
echo "demo: serving $JOINTSPACE_BUNDLE on $URL (database $JOINTSPACE_DATABASE_URL, log $LOG)" >&2
"$BIN" serve >"$LOG" 2>&1 &
SERVER_PID=$!
wait_ready "$URL" 600 kill -0 "$SERVER_PID" || { tail -30 "$LOG"; exit 1; }

# The catalogue feed into `demo`, beside the running server on the same database: the sync embeds the new
# pictures itself and the server follows its writes. The feed is the whole demo catalogue, so a smaller
# DEMO_STAMPS than last time withdraws the rest (--max-delete-share 1).
echo "demo: $count stamps into the collection demo (jointspace sync --feed $FEED)" >&2
RUST_LOG=${RUST_LOG:-warn} "$BIN" sync --collection demo --feed "$FEED" --create --text-fields name,description \
  --caption-fields description --max-delete-share 1

# The server's index follows the database's changes every 500 ms: wait until it holds the whole catalogue.
search() { # search TEXT K [MODE] -> the answer's JSON
  curl -fsS -X POST "$URL/v1/collections/demo/images/search" -H 'content-type: application/json' -d "$("$PY" -c '
import json, sys
print(json.dumps({"text": sys.argv[1], "k": int(sys.argv[2]), **({"mode": sys.argv[3]} if sys.argv[3:] else {})}))' "$@")"
}
have=0
for _ in $(seq 600); do
  have=$(search "a picture" "$count" vector | "$PY" -c 'import json, sys; print(len(json.load(sys.stdin)["results"]))')
  [[ "$have" == "$count" ]] && break
  sleep 0.1
done
[[ "$have" == "$count" ]] || { echo "demo: $have of $count stamps in the server's index" >&2; exit 1; }

# Three example searches: stamps' own sentences (the first of each description), from stamps far apart in the
# catalogue (things rather than letters and signs, where there are some), each shown only when the stamp it
# describes is among the first three found; the candidates are tried in that order until three are.
mapfile -t candidates < <("$PY" - "$STAMPS_GALLERY/manifest.jsonl" "$FEED" <<'EOF'
import json, sys
query = {r["external_id"]: r["query"] for r in map(json.loads, open(sys.argv[1], encoding="utf-8"))}
items = [json.loads(line) for line in open(sys.argv[2], encoding="utf-8")]
things = [i for i in items if i["category"] != "symbols"] or items
step = max(1, len(things) // 3)
for offset in range(step):
    for k in range(offset, len(things), step):
        print(query[things[k]["id"]] + "\t" + things[k]["name"])
EOF
)
echo
echo "The demo catalogue: $count stamps in the collection \"demo\", ready in $((SECONDS - started)) s."
echo "Search page: $URL/"
echo "Example searches (hybrid: by meaning and by words):"
found=0 tried=0
for line in "${candidates[@]}"; do
  (( found < 3 && tried < 60 )) || break
  tried=$((tried + 1))
  q=${line%%$'\t'*} want=${line#*$'\t'}
  top=$(search "$q" 3 | "$PY" -c 'import json, sys; print(" | ".join(h["image"]["metadata"].get("name", "?") for h in json.load(sys.stdin)["results"]))')
  [[ " | $top | " == *" | $want | "* ]] || continue
  found=$((found + 1))
  body=$("$PY" -c 'import json, sys; print(json.dumps({"text": sys.argv[1], "k": 3}))' "$q")
  echo "  curl -s -X POST $URL/v1/collections/demo/images/search -H 'content-type: application/json' -d '${body//\'/\'\\\'\'}'"
  echo "    -> $top"
done
if $check; then
  (( found == 3 )) || { echo "demo: $found of $tried searches by a stamp's own sentence found it among the first three" >&2; exit 1; }
  echo "demo: the example searches found the stamps they describe ($tried tried)"
  exit 0
fi
echo "Serving until Ctrl-C."
wait "$SERVER_PID"
