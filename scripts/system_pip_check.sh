#!/usr/bin/env bash
# Install TinyContext the way many people do: the system Python's `python3 -m venv` and the pip it
# ships (Debian 12: pip 23), NOT upgraded; then `tinycontext doctor` and a start of both servers.
# Catches a dependency that only new pip resolves (justext's lxml[html_clean] needed lxml_html_clean).
#
#   bash scripts/system_pip_check.sh [VENV]        # install into VENV (default: a temporary folder), then check
#   bash scripts/system_pip_check.sh --install-only VENV / --check-only VENV
#
# PYTHON picks the interpreter (default: /usr/bin/python3 when it exists, else python3). CI runs it
# after the test suite, so the wheels come from pip's cache.
set -euo pipefail
cd "$(dirname "$0")/.."
phase=all
case ${1:-} in --install-only) phase=install; shift ;; --check-only) phase=check; shift ;; esac
VENV=${1:-$(mktemp -d)/venv}
PYTHON=${PYTHON:-$([ -x /usr/bin/python3 ] && echo /usr/bin/python3 || echo python3)}
log() { printf '[system-pip +%3ss] %s\n' "$SECONDS" "$*"; }

if [ "$phase" != check ]; then
    "$PYTHON" -m venv "$VENV"
    log "$("$VENV/bin/python" --version), $("$VENV/bin/python" -m pip --version | cut -d' ' -f1-2) (as the venv module ships it)"
    PIP_DISABLE_PIP_VERSION_CHECK=1 "$VENV/bin/python" -m pip install --quiet '.[http,browser]'
    log "installed .[http,browser]"
fi
[ "$phase" = install ] && exit 0

DATA=$(mktemp -d)
SERVER=
cleanup() {
    [ -n "$SERVER" ] && kill "$SERVER" 2>/dev/null && wait "$SERVER" 2>/dev/null
    rm -rf "$DATA"
}
trap cleanup EXIT
export TINYCONTEXT_MEMORY_DB_PATH=$DATA/memory.db TINYCONTEXT_MODELS_DIR=$DATA/models TINYCONTEXT_CONFIG_PATH=$DATA/config.json
echo '{}' >"$DATA/config.json"
cd "$DATA"  # import the installed package, not the checkout
"$VENV/bin/tinycontext" doctor || { log "FAIL: doctor"; exit 1; }
PORT=$("$VENV/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
for kind in mcp rest; do
    "$VENV/bin/tinycontext" serve --host 127.0.0.1 --port "$PORT" $([ $kind = rest ] && echo --rest) >"$DATA/$kind.log" 2>&1 &
    SERVER=$!
    for _ in $(seq 240); do
        if "$VENV/bin/python" -c "import sys; from tinycontext.servers.health import probe; sys.exit(0 if probe(sys.argv[1], None, 2)[0] else 1)" \
            "http://127.0.0.1:$PORT/health"; then
            break
        fi
        kill -0 "$SERVER" 2>/dev/null || { log "FAIL: the $kind server exited: $(tail -5 "$DATA/$kind.log")"; exit 1; }
        sleep 0.5
    done
    "$VENV/bin/python" -c "import sys; from tinycontext.servers.health import probe; ok, said = probe(sys.argv[1], None, 5); print(said); sys.exit(0 if ok else 1)" \
        "http://127.0.0.1:$PORT/health" || { log "FAIL: the $kind server did not answer /health: $(tail -5 "$DATA/$kind.log")"; exit 1; }
    kill "$SERVER" && wait "$SERVER" 2>/dev/null || true
    SERVER=
    log "$kind server started from the system-pip install and answered /health"
done
log "ok"
