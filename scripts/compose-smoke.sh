#!/usr/bin/env bash
# deploy/compose.yaml, really run: podman-compose (PyPI, pinned) brings up Postgres and two jointspace replicas,
# a photo is ingested with its captions through replica 1 (admin key; a Flickr8k photo where the data set is
# there, else a fixture photo of the repository: scripts/lib.sh, smoke_photo), found by one of its captions
# through replica 2 (read key) once replica 2 has followed the change sequence, and everything is taken down
# with its volumes.
#
#   scripts/container-setup.sh && source /tmp/container-sandbox/env.sh   # once, on this kind of VM
#   scripts/compose-smoke.sh              # SKIP_BUILD=1: use jointspace:cpu as already built
#
# With no registry in reach, Postgres is deploy/standins/postgres (Debian's PostgreSQL 15 behind the official
# image's environment variables), built here unless POSTGRES_IMAGE names an image that exists.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
[[ -f /tmp/container-sandbox/env.sh && -z "${CONTAINERS_CONF:-}" ]] && source /tmp/container-sandbox/env.sh
command -v podman >/dev/null || { echo "compose-smoke: needs podman (scripts/container-setup.sh)" >&2; exit 1; }
PROJECT=jointspace-smoke-$$
export JOINTSPACE_PORT_1=${JOINTSPACE_PORT_1:-18181} JOINTSPACE_PORT_2=${JOINTSPACE_PORT_2:-18182}
export JOINTSPACE_ADMIN_KEY=compose-admin-$RANDOM$RANDOM$RANDOM JOINTSPACE_READ_KEY=compose-read-$RANDOM$RANDOM$RANDOM
export POSTGRES_PASSWORD=compose-pg-$RANDOM$RANDOM
VENV=.cache/compose-venv
if [[ ! -x $VENV/bin/podman-compose ]]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q "podman-compose==1.6.0"
fi
compose() { "$VENV/bin/podman-compose" -p "$PROJECT" -f deploy/compose.yaml "$@"; }
fail() {
  echo "compose-smoke: FAIL: $*" >&2
  for c in $(podman ps -a --filter "label=io.podman.compose.project=$PROJECT" --format '{{.Names}}'); do
    echo "--- $c" >&2; podman logs "$c" 2>&1 | tail -20 >&2
  done
  exit 1
}
cleanup() { compose down -v >/dev/null 2>&1 || true; }
trap cleanup EXIT

if [[ -z "${POSTGRES_IMAGE:-}" ]]; then
  if podman image exists docker.io/library/postgres:16-bookworm; then
    export POSTGRES_IMAGE=docker.io/library/postgres:16-bookworm
  else
    export POSTGRES_IMAGE=localhost/jointspace-postgres-standin:15
    podman image exists "$POSTGRES_IMAGE" || podman build -q -t "$POSTGRES_IMAGE" deploy/standins/postgres >/dev/null
  fi
fi
echo "compose-smoke: Postgres image $POSTGRES_IMAGE"
default_bundle_built || scripts/setup-python.sh
if [[ -z "${SKIP_BUILD:-}" ]]; then
  t=$SECONDS
  podman build --format docker --target cpu -t jointspace:cpu . >/dev/null
  echo "compose-smoke: image jointspace:cpu built in $((SECONDS - t)) s"
fi

t=$SECONDS
compose up -d >/dev/null 2>&1 || fail "podman-compose up"
r1=http://127.0.0.1:$JOINTSPACE_PORT_1 r2=http://127.0.0.1:$JOINTSPACE_PORT_2
for base in "$r1" "$r2"; do
  wait_ready "$base" $(( 300 - (SECONDS - t) )) || fail "a replica did not become ready"
done
echo "compose-smoke: Postgres and both replicas up and ready in $((SECONDS - t)) s"
ps=$(podman ps --filter "label=io.podman.compose.project=$PROJECT" --format '{{.Names}} {{.Status}}')
echo "$ps" | sed 's/^/compose-smoke:   /'
[[ $(grep -c . <<<"$ps") == 3 ]] || fail "expected 3 containers running"

adm=(-H "Authorization: Bearer $JOINTSPACE_ADMIN_KEY"); rd=(-H "Authorization: Bearer $JOINTSPACE_READ_KEY")
curl -fsS "${adm[@]}" -H 'content-type: application/json' -d '{"name":"compose"}' "$r1/v1/collections" >/dev/null \
  || fail "create a collection on replica 1"
smoke_photo 5 || fail "no photo to ingest"
img=$photo_name
form=(-F "image=@$photo" -F "external_id=$img")
for c in "${caps[@]}"; do form+=(-F "caption=$c"); done
added=$(curl -fsS "${adm[@]}" "${form[@]}" "$r1/v1/collections/compose/images") || fail "ingest on replica 1"
id=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["images"][0]["id"])' <<<"$added")
echo "compose-smoke: ingested $img as image $id through replica 1"
q=$(python3 -c 'import json,sys; print(json.dumps({"text": sys.argv[1], "k": 3}))' "${caps[0]}")
t=$SECONDS
until res=$(curl -fsS "${rd[@]}" -H 'content-type: application/json' -d "$q" "$r2/v1/collections/compose/images/search" 2>/dev/null) \
    && python3 -c 'import json,sys; r=json.load(sys.stdin); assert r["results"][0]["image"]["id"] == int(sys.argv[1])' "$id" <<<"$res" 2>/dev/null; do
  (( SECONDS - t < 30 )) || fail "replica 2 did not find image $id within 30 s: ${res:-no answer}"
  sleep 0.5
done
echo "compose-smoke: replica 2 found image $id by \"${caps[0]}\" after $((SECONDS - t)) s (read key)"
code=$(curl -s -o /dev/null -w '%{http_code}' "${rd[@]}" -X DELETE "$r2/v1/collections/compose/images/$id")
[[ "$code" == 403 ]] || fail "the read key deleting on replica 2: expected 403, got $code"
compose down -v >/dev/null 2>&1 || fail "podman-compose down"
left=$(podman ps -a --filter "label=io.podman.compose.project=$PROJECT" --format '{{.Names}}')
[[ -z "$left" ]] || fail "containers left after down: $left"
trap - EXIT
echo "compose-smoke: PASS (brought down, volumes removed)"
