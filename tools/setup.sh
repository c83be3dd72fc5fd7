#!/usr/bin/env bash
# Create .venv (if missing) and install sacbot with the given extras.
# torch is pinned to 2.13.0 in pyproject.toml: on these machines that is a local CPU
# wheel; an unpinned torch would make pip fetch a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
.venv/bin/python -m pip install -q -e ".${extras:+[$extras]}"
