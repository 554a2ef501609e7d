#!/usr/bin/env bash
# The README's test command: sets up .venv on a fresh machine, makes sure NATS and Redis answer, runs the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
if ! .venv/bin/python -c "import migsched, nats, redis, msgspec, pytest, hypothesis" 2>/dev/null \
   || [ pyproject.toml -nt .venv/.installed ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e ".[dev]"
  touch .venv/.installed
fi
# promtool checks the alert rules in deploy/prometheus; Debian's prometheus package has it (only the binary is
# kept, in .venv/bin; without it that one test is skipped and says why)
if ! command -v promtool >/dev/null && [ ! -x .venv/bin/promtool ] && command -v apt-get >/dev/null; then
  tmp=$(mktemp -d)
  if (cd "$tmp" && timeout 120 apt-get download -q prometheus >/dev/null 2>&1 && dpkg -x prometheus_*.deb x); then
    cp "$tmp/x/usr/bin/promtool" .venv/bin/promtool
  fi
  rm -rf "$tmp"
fi
# the dashboard's test drives a real headless browser: Debian's chromium, installed when this runs as root
# (as CI does); elsewhere that one test is skipped and says why
if ! command -v chromium >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  timeout 300 apt-get install -y -q --no-install-recommends chromium >/dev/null 2>&1 \
    || echo "chromium could not be installed: the dashboard's browser test will be skipped"
fi
# Tests resolve servers themselves (env URL, default port, or a private one); this only reports what answers.
.venv/bin/python - <<'PYEOF'
from shared.localservers import DEFAULT_NATS, DEFAULT_REDIS, _answers
for name, url in (("NATS", DEFAULT_NATS), ("Redis", DEFAULT_REDIS)):
    print(f"{name} at {url}: {'answering' if _answers(url) else 'not answering, tests start a private one'}")
PYEOF
exec .venv/bin/python -m pytest "$@"
