#!/usr/bin/env bash
# The README's run command: sets up .venv on a fresh machine (as scripts/test.sh does), then runs the demo stack:
# NATS/Redis already listening locally are used, otherwise started; the services and two simulated executors
# run as processes; a short workload is replayed at a high speed-up; the KPIs are printed; everything stops.
# Extra arguments go to `migsched up` (e.g. ./scripts/run.sh --trace default --jobs 300 --speedup 3000).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
if ! .venv/bin/python -c "import migsched, nats, redis, msgspec, rich, uvloop" 2>/dev/null \
   || [ pyproject.toml -nt .venv/.installed ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e ".[dev]"
  touch .venv/.installed
fi
exec .venv/bin/python -m migsched up --demo "$@"
