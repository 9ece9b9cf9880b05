#!/usr/bin/env bash
# What scripts/test.sh needs beyond python3 and cargo, installed from Debian where missing (as root), so the test
# command runs on a fresh machine. Without root it only says what is missing, and fails.
#   C and C++ compilers: mozjpeg (the JPEG decoder that matches the trainer's PIL) and USearch (the HNSW index)
#     are built from source;
#   curl (schemathesis.sh and the container smoke tests talk to the server with it), python3-venv;
#   node and npm (deploy/k8s is validated against the Kubernetes schemas with kubernetes-models);
#   Postgres' server programs (the Postgres tests start throwaway servers: initdb + pg_ctl in a temporary folder);
#   chromium and chromium-driver (the search page in a real browser);
#   podman, runc, debootstrap (the container image is built and smoke-tested: scripts/container-setup.sh).
set -euo pipefail
need=()
command -v python3 >/dev/null || { echo "test-deps: python3 (3.11+) is required" >&2; exit 1; }
command -v cargo >/dev/null || { echo "test-deps: cargo is required (https://rustup.rs)" >&2; exit 1; }
{ command -v cc >/dev/null && command -v c++ >/dev/null; } || need+=(gcc g++)
command -v curl >/dev/null || need+=(curl)
python3 -m venv --help >/dev/null 2>&1 || need+=(python3-venv)
command -v npm >/dev/null || need+=(nodejs npm)
if [[ -z "${JOINTSPACE_PG_BIN:-}" ]] && ! command -v initdb >/dev/null && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  need+=(postgresql)
fi
{ [[ -x /usr/bin/chromium ]] && [[ -x /usr/bin/chromedriver ]]; } || need+=(chromium chromium-driver)
{ command -v podman >/dev/null && command -v runc >/dev/null && command -v debootstrap >/dev/null; } \
  || need+=(podman runc debootstrap)
(( ${#need[@]} )) || exit 0
if [[ $(id -u) != 0 ]]; then
  echo "test-deps: missing Debian packages: ${need[*]} (apt-get install ${need[*]}, as root)" >&2
  exit 1
fi
echo "test-deps: installing ${need[*]}" >&2
apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}"
