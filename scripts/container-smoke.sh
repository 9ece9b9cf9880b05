#!/usr/bin/env bash
# Builds the container image (CPU target) and smoke-tests it: start with API keys, wait for /readyz, check the
# health check and the non-root user, create a collection, ingest one photo with its captions (Flickr8k's first
# where the data set is there, else a fixture photo of the repository: scripts/lib.sh, smoke_photo), search by text
# (read key), check a read key cannot write, stop with SIGTERM and check the graceful shutdown.
#
#   scripts/container-smoke.sh                 # podman (here: source /tmp/container-sandbox/env.sh first) or docker
#   ENGINE=docker IMAGE=jointspace:cpu scripts/container-smoke.sh
#   SKIP_BUILD=1 scripts/container-smoke.sh    # test an image already built
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
ENGINE=${ENGINE:-$(command -v podman >/dev/null && echo podman || echo docker)}
IMAGE=${IMAGE:-jointspace:smoke}
PORT=${PORT:-18080}
NAME=jointspace-smoke-$$
ADMIN=smoke-admin-key-$RANDOM$RANDOM$RANDOM
READ=smoke-read-key-$RANDOM$RANDOM$RANDOM
fail() { echo "container-smoke: FAIL: $*" >&2; "$ENGINE" logs "$NAME" 2>&1 | tail -40 >&2 || true; exit 1; }
cleanup() { "$ENGINE" rm -f "$NAME" >/dev/null 2>&1 || true; }
trap cleanup EXIT

# The default bundle's generated files are built on the host (and copied into the image).
default_bundle_built || scripts/setup-python.sh
if [[ -z "${SKIP_BUILD:-}" ]]; then
  fmt=(); [[ "$ENGINE" == podman ]] && fmt=(--format docker)   # keeps HEALTHCHECK (OCI has none)
  t=$SECONDS
  "$ENGINE" build "${fmt[@]}" --target cpu -t "$IMAGE" .
  echo "container-smoke: image $IMAGE built in $((SECONDS - t)) s"
fi
"$ENGINE" image inspect "$IMAGE" --format '{{.Size}}' | awk '{printf "container-smoke: image size %.0f MB\n", $1/1e6}'
hc=$("$ENGINE" image inspect "$IMAGE" --format '{{json .Config.Healthcheck}}' 2>/dev/null || true)
[[ "$hc" == *readyz* ]] || fail "the image has no health check on /readyz (got: $hc)"

"$ENGINE" run -d --name "$NAME" -p "127.0.0.1:$PORT:8080" \
  -e JOINTSPACE_ADMIN_KEY="$ADMIN" -e JOINTSPACE_READ_KEY="$READ" "$IMAGE" >/dev/null
base=http://127.0.0.1:$PORT
t=$SECONDS
running() { "$ENGINE" inspect "$NAME" --format '{{.State.Running}}' | grep -q true; }
wait_ready "$base" 180 running || fail "the server did not become ready"
echo "container-smoke: ready in $((SECONDS - t)) s"
uid=$("$ENGINE" exec "$NAME" id -u)
[[ "$uid" != 0 ]] || fail "the server runs as root"
if [[ "$ENGINE" == podman ]]; then
  "$ENGINE" healthcheck run "$NAME" >/dev/null 2>&1 && echo "container-smoke: health check passes" \
    || echo "container-smoke: (podman healthcheck run unavailable here; /readyz answered above)"
fi

adm=(-H "Authorization: Bearer $ADMIN"); rd=(-H "Authorization: Bearer $READ")
code=$(curl -s -o /dev/null -w '%{http_code}' "$base/v1/collections")
[[ "$code" == 401 ]] || fail "no key: expected 401, got $code"
curl -fsS "${adm[@]}" -H 'content-type: application/json' -d '{"name":"smoke"}' "$base/v1/collections" >/dev/null \
  || fail "create collection"
smoke_photo 1 || fail "no photo to ingest"
img=$photo_name
form=(-F "image=@$photo" -F "external_id=$img")
for c in "${caps[@]}"; do form+=(-F "caption=$c"); done
added=$(curl -fsS "${adm[@]}" "${form[@]}" "$base/v1/collections/smoke/images") || fail "ingest"
id=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["images"][0]["id"])' <<<"$added")
echo "container-smoke: ingested $img as image $id with ${#caps[@]} captions"
code=$(curl -s -o /dev/null -w '%{http_code}' "${rd[@]}" -X DELETE "$base/v1/collections/smoke/images/$id")
[[ "$code" == 403 ]] || fail "read key deleting: expected 403, got $code"
q=$(python3 -c 'import json,sys; print(json.dumps({"text": sys.argv[1], "k": 5}))' "${caps[0]}")
res=$(curl -fsS "${rd[@]}" -H 'content-type: application/json' -d "$q" "$base/v1/collections/smoke/images/search") \
  || fail "search images by text"
check='import json, math, sys
r = json.load(sys.stdin); hits = r["results"]
assert hits and hits[0]["image"]["id"] == int(sys.argv[1]) and math.isfinite(hits[0]["score"]), r
h = hits[0]; print("container-smoke: search by text found image %d (score %.4f)" % (h["image"]["id"], h["score"]))'
python3 -c "$check" "$id" <<<"$res" || fail "search result: $res"
res=$(curl -fsS "${rd[@]}" -H 'content-type: application/json' -d "$q" "$base/v1/collections/smoke/captions/search") \
  || fail "search captions by text"
grep -q "$(printf '%s' "${caps[0]}" | cut -c1-20)" <<<"$res" || fail "caption search did not return the caption: $res"
metrics=$(curl -fsS "$base/metrics") || fail "/metrics"
grep -q '^jointspace_http_requests_total' <<<"$metrics" || fail "/metrics has no request counts"

t=$SECONDS
"$ENGINE" stop -t 30 "$NAME" >/dev/null
rc=$("$ENGINE" inspect "$NAME" --format '{{.State.ExitCode}}')
logs=$("$ENGINE" logs "$NAME" 2>&1)
grep -q '"shutting down"' <<<"$logs" || fail "no graceful shutdown in the log"
grep -q 'index snapshots written' <<<"$logs" || fail "no index snapshot at shutdown"
[[ "$rc" == 0 ]] || fail "exit code $rc after SIGTERM"
echo "container-smoke: stopped cleanly in $((SECONDS - t)) s (exit 0)"
echo "container-smoke: PASS"
