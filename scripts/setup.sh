#!/usr/bin/env bash
# Create .venv and install TinyContext with every extra (eval harness, notebooks + JupyterLab, distributed
# sweeps (submitit, Ray), HTTP, tests).
# Needs only python3 >= 3.11 and access to PyPI; models, tokenizer and test data are bundled or in ../shared.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e '.[all]'
