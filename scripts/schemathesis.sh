#!/usr/bin/env bash
# Fuzzes the running server against openapi.yaml with schemathesis (PyPI): every operation, generated valid
# and invalid requests; fails on any 5xx or any response that breaks the spec (status, content type, headers,
# body schema). Starts the release binary on the fixture bundle with a scratch database and an admin key.
#
#   scripts/schemathesis.sh                 # MAX_TIME=120 seconds of generation by default
#   MAX_TIME=600 scripts/schemathesis.sh
# Its own virtualenv (.cache/schemathesis-venv) keeps the tool out of the trainer's requirements.
set -euo pipefail
cd "$(dirname "$0")/.."
ST_VERSION=4.32.5
MAX_TIME=${MAX_TIME:-120}   # split between the two passes
venv=.cache/schemathesis-venv
if [[ ! -x "$venv/bin/st" ]] || ! "$venv/bin/st" --version | grep -q "$ST_VERSION"; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "schemathesis==$ST_VERSION"
fi
source scripts/server.sh
key=schemathesis-admin-key-$RANDOM$RANDOM
JOINTSPACE_ADMIN_KEY=$key start_server models/fixture-tiny --snapshot-interval 0 --request-timeout 30

# Something to find: a collection with an image and captions, so that reads and searches reach real rows.
auth=(-H "Authorization: Bearer $key")
curl -fsS "${auth[@]}" -H 'content-type: application/json' -d '{"name":"c"}' "$base/v1/collections" >/dev/null
curl -fsS "${auth[@]}" -F image=@tests/fixtures/images/fixture_0.png -F caption="a red square" -F external_id=x0 \
  "$base/v1/collections/c/images" >/dev/null

checks=not_a_server_error,status_code_conformance,content_type_conformance,response_headers_conformance,response_schema_conformance
status=0
echo "== schemathesis $ST_VERSION against $base: every operation, generated names and ids ($((MAX_TIME / 2))s)"
"$venv/bin/st" run openapi.yaml --url "$base" -H "Authorization: Bearer $key" --checks "$checks" \
  --max-time "$((MAX_TIME / 2))" --workers 2 --suppress-health-check all --no-color || status=$?
echo "== schemathesis: operations inside the collection \"c\" that holds data ($((MAX_TIME / 2))s)"
"$venv/bin/st" --config-file scripts/schemathesis.toml run openapi.yaml --include-path-regex '^/v1/collections/\{collection\}/' \
  --url "$base" -H "Authorization: Bearer $key" --checks "$checks" \
  --max-time "$((MAX_TIME / 2))" --workers 2 --suppress-health-check all --no-color || status=$?
# A 5xx also shows in the server's own log.
check_server || status=1
exit "$status"
