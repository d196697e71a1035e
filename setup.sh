#!/usr/bin/env bash
# Create .venv (if missing) and install requirement groups into it at the exact versions of
# requirements/lock.txt. With no argument: the core (train, evaluate, translate, plot). Name groups
# to add them: `bash setup.sh export jax` (export.py's packages, the JAX backend), `bash setup.sh dev`
# (everything the tests, the linter and the lesson's runner need).
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
groups=("${@:-core}")
args=()
for group in "${groups[@]}"; do
  if [ ! -f "requirements/$group.txt" ] || [ "$group" = lock ]; then
    echo "error: setup.sh: no requirement group '$group'; the groups are core, export, jax, dev (requirements/)" >&2
    exit 2
  fi
  args+=(-r "requirements/$group.txt")
done
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet "${args[@]}" -c requirements/lock.txt
echo "environment ready (${groups[*]}): $(.venv/bin/python --version), keras $(.venv/bin/python -c 'import keras; print(keras.__version__)' 2>/dev/null), $(du -sh .venv | cut -f1) in .venv"
