# Sourced by the scripts that run the server (serve.sh, server.sh, test.sh, bench.sh, memory.sh,
# page-screenshot.sh, container-smoke.sh, compose-smoke.sh): the two things each needs, written once.

# ORT_DYLIB_PATH, exported: the caller's, or onnxruntime's shared library from the .venv that
# scripts/setup-python.sh made (the server loads it at start: ort's load-dynamic).
ort_dylib() {
  if [[ -z "${ORT_DYLIB_PATH:-}" ]]; then
    ORT_DYLIB_PATH=$(ls "$PWD"/.venv/lib/python3*/site-packages/onnxruntime/capi/libonnxruntime.so.* 2>/dev/null | head -n 1)
  fi
  [[ -f "$ORT_DYLIB_PATH" ]] || {
    echo "no onnxruntime library (run scripts/setup-python.sh, or set ORT_DYLIB_PATH)" >&2
    return 1
  }
  export ORT_DYLIB_PATH
}

# wait_ready URL SECONDS [CHECK...]: polls URL/readyz until it answers 200; fails (returns 1, saying why) after
# SECONDS, or as soon as the command CHECK (e.g. `kill -0 $pid`: is the server still running?) fails.
wait_ready() {
  local url=$1 limit=$2 start=$SECONDS
  shift 2
  until curl -fsS "$url/readyz" >/dev/null 2>&1; do
    if (( $# )) && ! "$@" 2>/dev/null; then
      echo "the server stopped before $url/readyz answered" >&2
      return 1
    fi
    if (( SECONDS - start >= limit )); then
      echo "$url/readyz not ready after $limit s" >&2
      return 1
    fi
    sleep 0.05
  done
}

# Builds the bench binary (benches/bench.rs) and prints its path.
bench_binary() {
  cargo bench -q --locked --bench bench --no-run --message-format=json | python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "bench":
        print(m["executable"])'
}
