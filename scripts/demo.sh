#!/usr/bin/env bash
# The main job: a worker on the embedded SQLite default runs the tasks of examples/quickstart.py.
# It enqueues a few thousand jobs, processes them with two worker processes and a progress bar,
# then exits. Installs what is missing first (a virtualenv with jobqueue in it).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

ensure_python no
ensure_venv .
say "running examples/quickstart.py"
exec "$VENV/bin/python" examples/quickstart.py "$@"
