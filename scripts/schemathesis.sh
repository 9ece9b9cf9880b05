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
ORT_DYLIB_PATH=${ORT_DYLIB_PATH:-$(ls "$PWD"/.venv/lib/python3*/site-packages/onnxruntime/capi/libonnxruntime.so.* | head -n 1)}
export ORT_DYLIB_PATH
cargo build --locked --release --bin jointspace
bin=${CARGO_TARGET_DIR:-target}/release/jointspace

work=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
key=schemathesis-admin-key-$RANDOM$RANDOM
JOINTSPACE_ADMIN_KEY=$key "$bin" serve --addr "127.0.0.1:$port" --bundle models/fixture-tiny \
  --database-url "sqlite://$work/js.db" --snapshot-interval 0 --request-timeout 30 >"$work/server.log" 2>&1 &
pid=$!
cleanup() { kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
base=http://127.0.0.1:$port
for _ in $(seq 120); do curl -fsS "$base/readyz" >/dev/null 2>&1 && break; sleep 0.5; done
curl -fsS "$base/readyz" >/dev/null || { cat "$work/server.log"; exit 1; }

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
# A 5xx also shows in the server's own log; print what it said, and fail on any server error line.
if grep -q '"request failed"\|request failed' "$work/server.log"; then
  echo "== server errors logged:"; grep 'request failed' "$work/server.log" | head -20
  status=1
fi
kill -0 "$pid" 2>/dev/null || { echo "the server died"; tail -50 "$work/server.log"; exit 1; }
exit "$status"
