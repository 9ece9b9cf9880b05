#!/usr/bin/env bash
# The Python client's checks: its own virtualenv (.cache/client-python-venv at the repository root) with the
# package installed as a user would (`pip install ./clients/python`: httpx from PyPI), pytest, ruff and mypy;
# then ruff check and format, mypy --strict over the package (its type hints are part of what it ships:
# py.typed), and the tests against real servers: the release binary ($JOINTSPACE_BIN, default
# target/release/jointspace, under $CARGO_TARGET_DIR where set) on the fixture bundle, ORT_DYLIB_PATH as scripts/lib.sh finds it.
#
#   clients/python/test.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/lib.sh
ort_dylib
PYTEST_VERSION=9.2.0
RUFF_VERSION=0.17.6
MYPY_VERSION=2.4.1
venv=.cache/client-python-venv
if ! "$venv/bin/python" -c "import pytest, sys; sys.exit(pytest.__version__ != '$PYTEST_VERSION')" 2>/dev/null \
   || [[ "$("$venv/bin/ruff" --version 2>/dev/null)" != "ruff $RUFF_VERSION" ]] \
   || ! "$venv/bin/mypy" --version 2>/dev/null | grep -q "^mypy $MYPY_VERSION "; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "pytest==$PYTEST_VERSION" "ruff==$RUFF_VERSION" "mypy==$MYPY_VERSION"
fi
# Always reinstalled: the tests run against the package as built from this checkout, not a stale copy.
"$venv/bin/pip" install -q --disable-pip-version-check --force-reinstall --no-deps ./clients/python
"$venv/bin/pip" install -q --disable-pip-version-check ./clients/python
rm -rf clients/python/build clients/python/src/*.egg-info
export JOINTSPACE_BIN=${JOINTSPACE_BIN:-${CARGO_TARGET_DIR:-$PWD/target}/release/jointspace}
cd clients/python
echo "-- ruff check, ruff format --check"
"../../$venv/bin/ruff" check .
"../../$venv/bin/ruff" format --check .
echo "-- mypy --strict (src/)"
"../../$venv/bin/mypy" src
echo "-- pytest against $JOINTSPACE_BIN"
"../../$venv/bin/python" -m pytest -p no:cacheprovider "$@"
