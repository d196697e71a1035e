#!/usr/bin/env bash
# The quick start: set up, then prepro -> train -> eval on the built-in sample corpus (a few minutes on a CPU).
set -euo pipefail
cd "$(dirname "$0")"
bash setup.sh
.venv/bin/python prepro.py --preset sample
.venv/bin/python train.py --preset sample
.venv/bin/python eval.py --preset sample
