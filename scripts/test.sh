#!/usr/bin/env bash
# The whole test suite: the trainer's pytest and ruff, the server's rustfmt and clippy, then its cargo tests on the
# real runtime.
# Installs what it needs itself (.venv with the trainer's requirements), so it runs on a fresh machine.
# Last, schemathesis fuzzes the running server against openapi.yaml (its own venv in .cache/, ~3 minutes), and the
# search page is driven in chromium by Selenium (scripts/browser-test.sh, its own venv in .cache/, ~1 minute).
set -euo pipefail
cd "$(dirname "$0")/.."
# The Postgres tests (tests/common/pg.rs) start throwaway servers themselves; say early what is missing.
if [ -z "${JOINTSPACE_PG_BIN:-}" ] && ! command -v initdb >/dev/null && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  echo "scripts/test.sh: the Postgres tests need Postgres' server programs (initdb, pg_ctl):" \
       "apt-get install postgresql, or set JOINTSPACE_PG_BIN to their folder" >&2
  exit 1
fi
scripts/setup-python.sh --train
echo "== trainer tests (pytest)"
(cd train && ../.venv/bin/python -m pytest)
echo "== trainer lint (ruff check; settings in train/pyproject.toml)"
(cd train && ../.venv/bin/ruff check .)
echo "== deploy manifests (deploy/k8s against the Kubernetes API schemas, offline: npm kubernetes-models)"
command -v npm >/dev/null || { echo "scripts/test.sh: validating deploy/k8s needs node and npm (apt-get install nodejs npm)" >&2; exit 1; }
(cd deploy/validate && npm ci --no-audit --no-fund --loglevel=error)
node deploy/validate/validate.mjs deploy/k8s --self-test
echo "== server style and lints (cargo fmt --check; cargo clippy --all-targets -D warnings, [lints] in Cargo.toml)"
cargo fmt --check
# --release shares the build scripts' C and C++ outputs (mozjpeg, USearch) with the test build below.
cargo clippy --locked --release --all-targets -- -D warnings
# Real camera-size photos for the preparation's parity test (scikit-image's samples, from its wheel by version).
(cd train && ../.venv/bin/python -m jointspace_train photos --out ../.cache/photos)
ORT_DYLIB_PATH=$(ls "$PWD"/.venv/lib/python3*/site-packages/onnxruntime/capi/libonnxruntime.so.* | head -n 1)
export ORT_DYLIB_PATH
echo "== server tests (cargo test, ORT_DYLIB_PATH=$ORT_DYLIB_PATH)"
cargo test --locked --release
echo "== API against its spec (schemathesis: no 5xx, every response as openapi.yaml says)"
MAX_TIME=${SCHEMATHESIS_SECONDS:-120} scripts/schemathesis.sh
echo "== the search page in a real browser (chromium + Selenium: upload, search, open, more like this)"
scripts/browser-test.sh
