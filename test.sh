#!/usr/bin/env bash
# Install what the tests need (bash setup.sh dev: the pinned environment of requirements/lock.txt),
# then run a tier of the suite:
#   bash test.sh         the quick tier: every unit and layer test, save/load, decoding equalities,
#                        the quick start end to end (a few minutes on a 2-core CPU)
#   bash test.sh slow    the rest: the documents' commands, the lesson, the JAX re-run, the
#                        distributed, fault and export tests (what .ci/run runs after the quick tier)
#   bash test.sh all     both in one run
# Arguments after the tier go to pytest (e.g. `bash test.sh quick -n 0 tests/test_modules.py`).
set -euo pipefail
cd "$(dirname "$0")"
tier=${1:-quick}
case "$tier" in
  quick) marks=(-m "not slow") ;;
  slow) marks=(-m slow) ;;
  all) marks=() ;;
  *) echo "error: test.sh: no tier '$tier'; the tiers are quick (the default), slow, all" >&2; exit 2 ;;
esac
shift $(( $# > 0 ? 1 : 0 ))
bash setup.sh dev
.venv/bin/python -m pytest -q "${marks[@]}" "$@"
