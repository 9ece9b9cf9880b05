#!/usr/bin/env bash
# The whole test suite: the trainer's pytest, then the server's cargo tests on the real runtime.
# Installs what it needs itself (.venv with the trainer's requirements), so it runs on a fresh machine.
# Last, schemathesis fuzzes the running server against openapi.yaml (its own venv in .cache/, ~3 minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-python.sh --train
echo "== trainer tests (pytest)"
(cd train && ../.venv/bin/python -m pytest)
ORT_DYLIB_PATH=$(ls "$PWD"/.venv/lib/python3*/site-packages/onnxruntime/capi/libonnxruntime.so.* | head -n 1)
export ORT_DYLIB_PATH
echo "== server tests (cargo test, ORT_DYLIB_PATH=$ORT_DYLIB_PATH)"
cargo test --locked --release
echo "== API against its spec (schemathesis: no 5xx, every response as openapi.yaml says)"
MAX_TIME=${SCHEMATHESIS_SECONDS:-120} scripts/schemathesis.sh
