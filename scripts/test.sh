#!/usr/bin/env bash
# The whole test suite on SQLite, PostgreSQL and MariaDB, from a fresh Debian machine.
# Installs what is missing (Debian packages, PgBouncer among them, a virtualenv with the Python
# packages), starts stopped database servers, creates its own login and databases, then runs the
# checks of CONTRIBUTING.md (ruff, import-linter, mypy) and pytest.
# Arguments go to pytest, e.g. scripts/test.sh tests/unit -x
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

ensure_debs gcc pkg-config libmariadb-dev postgresql mariadb-server mariadb-client procps
# the dashboard's browser test drives Debian's Chromium; nothing downloads a browser at test time
ensure_debs chromium chromium-driver
ensure_pgbouncer  # the pooler tests start their own, in transaction mode
ensure_python yes
ensure_java
start_postgres
start_mariadb
create_test_roles
ensure_venv ".[dev]"

export JOBQUEUE_TEST_REQUIRE_ALL=1  # a missing server fails the run; it is never skipped
say "ruff"
"$VENV/bin/ruff" check
"$VENV/bin/ruff" format --check
say "import-linter"
"$VENV/bin/lint-imports"
say "mypy"
"$VENV/bin/mypy"
say "pytest"
# The suite starts hundreds of Python processes (the CLI, workers, example sites). Where
# PYTHONDONTWRITEBYTECODE is set, each would compile jobqueue's sources anew: compile them once.
"$VENV/bin/python" -m compileall -q jobqueue tests examples benchmarks > /dev/null
# Three pytest processes (pytest-xdist) share the tests: most of a test's time is spent waiting on
# the processes it started, so three keep two cores busy. `scripts/test.sh -n 0` runs them in one.
exec "$VENV/bin/python" -m pytest -n 3 --dist loadgroup "$@"
