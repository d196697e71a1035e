#!/usr/bin/env bash
# Create .venv (if missing) and install requirement groups into it at the exact versions of
# requirements/lock.txt. With no argument: the core (train, evaluate, translate, plot). Name groups
# to add them: `bash setup.sh export jax` (export.py's packages, the JAX backend), `bash setup.sh dev`
# (everything the tests, the linter and the lesson's runner need), `bash setup.sh page` (page.py's Flask).
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
groups=("${@:-core}")
args=()
for group in "${groups[@]}"; do
  if [ ! -f "requirements/$group.txt" ] || [ "$group" = lock ]; then
    echo "error: setup.sh: no requirement group '$group'; the groups are core, export, jax, page, dev (requirements/)" >&2
    exit 2
  fi
  args+=(-r "requirements/$group.txt")
done
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# A stamp of what was installed: the same groups at the same pins again install nothing (test.sh
# runs this before every test run).
stamp=".venv/.installed-$(cat requirements/*.txt | sha256sum | cut -c1-16)-$(IFS=_; echo "${groups[*]}")"
keras_version() { .venv/bin/python -c 'from importlib.metadata import version; print(version("keras"))' 2>/dev/null; }
if [ -f "$stamp" ]; then
  echo "environment ready (${groups[*]}): $(.venv/bin/python --version), keras $(keras_version), installed already"
  exit 0
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet "${args[@]}" -c requirements/lock.txt
touch "$stamp"
echo "environment ready (${groups[*]}): $(.venv/bin/python --version), keras $(keras_version), $(du -sh .venv | cut -f1) in .venv"
