# Sourced by scripts that need a running release server (schemathesis.sh, soak.sh):
#   start_server BUNDLE [more serve flags]
# builds the binary, starts it on a free port with a scratch SQLite database, waits for /readyz, and sets
# `base` (its URL), `pid`, and `work` (a scratch folder with server.log), removed with the server on exit.
source scripts/lib.sh
ort_dylib

start_server() {
  local bundle=$1 port
  shift
  # The binary as `cargo test` builds it (with the test build's feature set): after the tests, no rebuild.
  cargo test --locked --release --workspace --no-run
  work=$(mktemp -d)
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  "${CARGO_TARGET_DIR:-target}/release/jointspace" serve --addr "127.0.0.1:$port" --bundle "$bundle" \
    --database-url "sqlite://$work/js.db" "$@" >"$work/server.log" 2>&1 &
  pid=$!
  trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -rf "$work"' EXIT
  base=http://127.0.0.1:$port
  wait_ready "$base" 120 kill -0 "$pid" && return 0
  tail -30 "$work/server.log"
  return 1
}

# After a run: fails (returns 1) when the server logged a server error or is no longer running.
check_server() {
  local status=0
  if grep -q 'request failed' "$work/server.log"; then
    echo "== server errors logged:"; grep 'request failed' "$work/server.log" | head -20
    status=1
  fi
  kill -0 "$pid" 2>/dev/null || { echo "the server died"; tail -50 "$work/server.log"; status=1; }
  return $status
}
