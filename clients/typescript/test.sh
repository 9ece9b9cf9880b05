#!/usr/bin/env bash
# The TypeScript client (clients/typescript) against the real server: npm ci from the lock file, the check
# that src/schema.ts is what openapi-typescript makes of openapi.yaml, the tsc build, the TypeScript examples
# of docs/api.md compiled against it, then node's test runner
# on the built tests, each file starting $JOINTSPACE_BIN (default target/release/jointspace, under $CARGO_TARGET_DIR where set) with the fixture
# bundle on a scratch SQLite database.
#
#   clients/typescript/test.sh            (scripts/test.sh runs it after the browser test)
# Needs node 20+ and npm, the release binary (cargo build --release) and ORT_DYLIB_PATH (or the .venv that
# scripts/setup-python.sh makes).
set -euo pipefail
cd "$(dirname "$0")"
root=$(cd ../.. && pwd)
export JOINTSPACE_BIN=${JOINTSPACE_BIN:-${CARGO_TARGET_DIR:-$root/target}/release/jointspace}
if [[ -z "${ORT_DYLIB_PATH:-}" ]]; then
  # shellcheck disable=SC1091
  ORT_DYLIB_PATH=$(cd "$root" && source scripts/lib.sh && ort_dylib && echo "$ORT_DYLIB_PATH")
  export ORT_DYLIB_PATH
fi
npm ci --no-audit --no-fund --loglevel=error
npm run --silent check-types
npm run --silent build
npm run --silent check-docs
npm run --silent build-tests
echo "== the TypeScript client against $JOINTSPACE_BIN"
node --test --test-concurrency=1 --test-reporter=spec dist/test/*.test.js
