#!/usr/bin/env bash
# Create .venv (if missing) and install the pinned requirements into it.
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -r requirements.txt
echo "environment ready: $(.venv/bin/python --version), keras $(.venv/bin/python -c 'import keras; print(keras.__version__)' 2>/dev/null)"
