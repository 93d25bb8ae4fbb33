#!/usr/bin/env bash
# Install everything the tests need on a fresh Debian machine (as root), then run them.
# Usage: bash scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian's chromium for the real-browser test (Playwright drives it; no browser download).
if ! command -v chromium >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
fi
# A CPU build of torch from local disk (a bare `torch` would pull GBs of CUDA wheels).
python3 -m pip install -q --disable-pip-version-check torch==2.13.0
python3 -m pip install -q --disable-pip-version-check -e '.[dev]'

set +e
python3 -m pytest "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: that is a failure" >&2
  exit 1
fi
exit "$rc"
