#!/usr/bin/env bash
# Create .venv and install TinyContext with every extra (eval harness, notebooks + JupyterLab, distributed
# sweeps (submitit, Ray), HTTP, browser, tests).
# Needs only python3 >= 3.11 and access to PyPI; models, tokenizer and test data are bundled or in ../shared.
# The browser tools drive the system Chromium: as root on Debian/Ubuntu it is installed here when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e '.[all]'
if ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null && ! command -v google-chrome >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    else
        echo "note: no Chromium found; the browser tools need one (apt-get install chromium, or set browser_executable_path)" >&2
    fi
fi
# The MCP Inspector CLI (npm) validates the MCP surface in a test; installed here so no test downloads anything.
if command -v npm >/dev/null; then
    npm install --silent --no-audit --no-fund --prefix .venv/node @modelcontextprotocol/inspector >/dev/null \
        || echo "note: could not install the MCP Inspector; its test will be skipped" >&2
fi
