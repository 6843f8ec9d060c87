#!/usr/bin/env bash
# Release check for the Docker tier (docs/docker.md). Run as root on a Debian-like machine
# from a clone whose .venv exists (bash scripts/setup.sh): the MCP SDK client runs from it.
#
#   sudo bash scripts/docker_smoke.sh
#
# Environment (all optional; nothing about this machine is written here):
#   BASE_IMAGE  base for the build. Unset: a Debian base made with debootstrap from the mirror apt
#               already uses, imported as tinycontext-base:<codename> (no registry is contacted).
#               Set: used as is, pulled only if it is not local.
#   CA_BUNDLE   CA bundle handed to pip in the build as a BuildKit secret; defaults to PIP_CERT,
#               REQUESTS_CA_BUNDLE or SSL_CERT_FILE when one of them names a file.
#   KEEP=1      keep the containers, volumes and temporary files for inspection.
#   QUICK=1     only build the image and check that it serves MCP (save, recall, token) in a container
#               with no network at all (--network none: its own loopback); no compose, no published ports.
#   PY          the Python that runs the MCP SDK client and small helpers (default: .venv/bin/python).
# Exits 0 when every check passed; prints a timed summary either way.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PY:-$ROOT/.venv/bin/python}
CLIENT=$ROOT/scripts/docker_smoke_client.py
IMAGE=tinycontext:latest
export COMPOSE_PROJECT_NAME=tcsmoke$$
WORK=$(mktemp -d)
STARTED_DOCKERD=
FAILED=0
declare -a SUMMARY=()

log() { printf '[%s +%4ss] %s\n' "$(date -u +%H:%M:%S)" "$SECONDS" "$*"; }
note() { SUMMARY+=("$*"); log "$*"; }
pass() { note "PASS $*"; }
fail() { note "FAIL $*"; FAILED=1; }
die() { fail "$*"; exit 1; }
free_port() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

cleanup() {
    local code=$?
    if [ -z "${KEEP:-}" ]; then
        compose down -v --remove-orphans >/dev/null 2>&1 || true
        COMPOSE_PROJECT_NAME=${COMPOSE_PROJECT_NAME}secret compose -f compose.yaml -f compose.secret.yaml down -v >/dev/null 2>&1 || true
        docker rm -f $(docker ps -aq --filter "name=^${COMPOSE_PROJECT_NAME}") >/dev/null 2>&1 || true
        docker volume rm $(docker volume ls -q --filter "name=^${COMPOSE_PROJECT_NAME}") >/dev/null 2>&1 || true
        rm -rf "$WORK"
    fi
    [ -n "${HOLDER_PID:-}" ] && kill "$HOLDER_PID" 2>/dev/null
    if [ -n "$STARTED_DOCKERD" ] && [ -z "${KEEP:-}" ]; then
        kill "$STARTED_DOCKERD" 2>/dev/null && wait "$STARTED_DOCKERD" 2>/dev/null || true
    fi
    echo
    echo "== docker smoke summary (${SECONDS}s in all) =="
    printf '%s\n' "${SUMMARY[@]}"
    [ "$code" -eq 0 ] && [ "$FAILED" -eq 0 ] && echo "ALL PASSED" || { echo "FAILED"; exit 1; }
}
trap cleanup EXIT

# -- tools and the daemon ---------------------------------------------------------------------
[ -x "$PY" ] || die "no $PY: run bash scripts/setup.sh first (the MCP SDK client runs from it)"
missing=()
command -v dockerd >/dev/null || missing+=(docker.io)
[ -n "${QUICK:-}" ] || command -v docker-compose >/dev/null || docker compose version >/dev/null 2>&1 || missing+=(docker-compose)
[ -n "${BASE_IMAGE:-}" ] || command -v debootstrap >/dev/null || missing+=(debootstrap)
if [ ${#missing[@]} -gt 0 ]; then
    log "installing ${missing[*]} with apt-get"
    { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"; } >"$WORK/apt.log" 2>&1 \
        || die "apt-get install ${missing[*]} failed: $(tail -5 "$WORK/apt.log")"
fi
if ! docker info >/dev/null 2>&1; then
    log "starting dockerd (log: $WORK/dockerd.log)"
    dockerd >"$WORK/dockerd.log" 2>&1 &
    STARTED_DOCKERD=$!
    for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
    docker info >/dev/null 2>&1 || die "dockerd did not start: $(tail -5 "$WORK/dockerd.log")"
fi
# `docker compose` (v2 plugin) where it exists, else docker-compose (v1), so docs/docker.md's commands run as written.
if docker compose version >/dev/null 2>&1; then
    compose() { docker compose "$@"; }
else
    compose() { docker-compose "$@"; }
    docker() { if [ "$1" = compose ]; then shift; docker-compose "$@"; else command docker "$@"; fi; }
fi
# A client that builds with BuildKit (needed for the CA secret): buildx, or a docker CLI with it built in.
BUILD=()
if command docker buildx version >/dev/null 2>&1; then
    BUILD=(command docker buildx build --load)
else
    for candidate in $(type -ap docker); do
        if DOCKER_BUILDKIT=1 "$candidate" build --help >/dev/null 2>&1; then BUILD=(env DOCKER_BUILDKIT=1 "$candidate" build); break; fi
    done
fi
[ ${#BUILD[@]} -gt 0 ] || die "no docker client here builds with BuildKit (install docker-buildx or docker.io)"
if [ -n "${QUICK:-}" ]; then
    note "docker: server $(command docker version -f '{{.Server.Version}}') (QUICK=1: no compose)"
else
    note "docker: server $(command docker version -f '{{.Server.Version}}'), compose: $(compose version --short 2>/dev/null || compose version | head -1)"
fi

# -- base image and build ---------------------------------------------------------------------
if [ -z "${BASE_IMAGE:-}" ]; then
    . /etc/os-release
    BASE_IMAGE=tinycontext-base:${VERSION_CODENAME}
    if ! command docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
        mirror=$(apt-get indextargets --format '$(REPO_URI) $(CODENAME)' 'Created-By: Packages' 2>/dev/null \
                 | awk -v c="$VERSION_CODENAME" '$2 == c {print $1; exit}')
        [ -n "$mirror" ] || die "no apt source for $VERSION_CODENAME to debootstrap from (set BASE_IMAGE instead)"
        log "debootstrap $VERSION_CODENAME from $mirror"
        t0=$SECONDS
        debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates "$VERSION_CODENAME" "$WORK/rootfs" "$mirror" \
            >"$WORK/debootstrap.log" 2>&1 || die "debootstrap failed: $(tail -5 "$WORK/debootstrap.log")"
        rm -rf "$WORK"/rootfs/var/cache/apt/archives/*.deb "$WORK"/rootfs/var/lib/apt/lists/* \
               "$WORK"/rootfs/usr/share/doc "$WORK"/rootfs/usr/share/man "$WORK"/rootfs/usr/share/locale
        tar -C "$WORK/rootfs" -c . | command docker import -c 'CMD ["python3"]' - "$BASE_IMAGE" >/dev/null
        rm -rf "$WORK/rootfs"
        note "base image $BASE_IMAGE made with debootstrap in $((SECONDS - t0))s"
    else
        note "base image $BASE_IMAGE already here"
    fi
elif ! command docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
    command docker pull "$BASE_IMAGE" >/dev/null || die "cannot pull BASE_IMAGE=$BASE_IMAGE; unset it to build a Debian base with debootstrap"
fi
export BASE_IMAGE
CA_BUNDLE=${CA_BUNDLE:-}
for candidate in "${PIP_CERT:-}" "${REQUESTS_CA_BUNDLE:-}" "${SSL_CERT_FILE:-}"; do
    [ -z "$CA_BUNDLE" ] && [ -n "$candidate" ] && [ -f "$candidate" ] && CA_BUNDLE=$candidate
done
log "building $IMAGE from $BASE_IMAGE on the host network${CA_BUNDLE:+ with CA bundle $CA_BUNDLE}"
t0=$SECONDS
"${BUILD[@]}" --network host --build-arg BASE_IMAGE="$BASE_IMAGE" ${CA_BUNDLE:+--secret id=ca,src="$CA_BUNDLE"} -t "$IMAGE" . \
    >"$WORK/build.log" 2>&1 || die "docker build failed: $(tail -20 "$WORK/build.log")"
note "image built in $((SECONDS - t0))s; size $(command docker image inspect -f '{{.Size}}' "$IMAGE" | awk '{printf "%.0f MB", $1 / 1e6}')"
user=$(command docker run --rm --entrypoint id "$IMAGE" -u)
[ "$user" != 0 ] && pass "image runs as uid $user (not root); USER $(command docker image inspect -f '{{.Config.User}}' "$IMAGE")" \
    || fail "image runs as root"

# -- the image serves MCP in a container that has no network at all, only its own loopback ---------
NONET=${COMPOSE_PROJECT_NAME}_nonet
NONET_TOKEN=$("$PY" -c 'import secrets; print(secrets.token_urlsafe(32))')
t0=$SECONDS
command docker run -d --name "$NONET" --network none -e TINYCONTEXT_API_TOKEN="$NONET_TOKEN" "$IMAGE" >/dev/null
until command docker exec "$NONET" python -m tinycontext.servers.health >"$WORK/nonet_health.json" 2>&1; do
    [ "$(command docker inspect -f '{{.State.Status}}' "$NONET")" = running ] \
        || die "the container exited before serving: $(command docker logs --tail 20 "$NONET" 2>&1)"
    [ $((SECONDS - t0)) -lt 180 ] || die "no /health answer after 180 s: $(command docker logs --tail 20 "$NONET" 2>&1)"
    sleep 0.5
done
note "--network none: /health answers inside the container after $((SECONDS - t0))s: $(cat "$WORK/nonet_health.json")"
command docker exec -i "$NONET" python - basic --mcp http://127.0.0.1:8765/mcp --token "$NONET_TOKEN" <"$CLIENT" >"$WORK/nonet.json" 2>&1 \
    && pass "--network none: MCP save/recall and the token check inside the container: $(cat "$WORK/nonet.json")" \
    || fail "--network none: MCP inside the container: $(cat "$WORK/nonet.json")"
command docker rm -f "$NONET" >/dev/null
[ -z "${QUICK:-}" ] || exit 0

# -- docs/docker.md's commands, verbatim ----------------------------------------------------------------
export MCP_PUBLISH_PORT=$(free_port) REST_PUBLISH_PORT=$(free_port)
MCP=http://127.0.0.1:$MCP_PUBLISH_PORT/mcp
REST=http://127.0.0.1:$REST_PUBLISH_PORT
readme_block=$(awk '/^```bash/ {grab = 1; next} grab && /^```/ {exit} grab' docs/docker.md)
[ -n "$readme_block" ] || die "docs/docker.md has no bash block"
printf '%s\n' "$readme_block" >"$WORK/readme_commands.sh"
log "running docs/docker.md's commands:"; sed 's/^/    /' "$WORK/readme_commands.sh"
unset TINYCONTEXT_API_TOKEN
t0=$SECONDS
eval "$readme_block" >"$WORK/compose_up.log" 2>&1 || die "docs/docker.md's commands failed: $(tail -20 "$WORK/compose_up.log")"
[ -n "${TINYCONTEXT_API_TOKEN:-}" ] || die "docs/docker.md's commands did not set TINYCONTEXT_API_TOKEN"
TOKEN=$TINYCONTEXT_API_TOKEN

container_of() { compose ps -q "$1"; }
# Seconds until the container's HEALTHCHECK reports healthy (fails on exit or after 180 s).
wait_healthy() {
    local id=$1 start=$SECONDS state
    while :; do
        state=$(command docker inspect -f '{{.State.Status}} {{if .State.Health}}{{.State.Health.Status}}{{end}}' "$id")
        case $state in
            "running healthy") echo $((SECONDS - start)); return 0 ;;
            exited*|dead*) log "container $id $state: $(command docker logs --tail 20 "$id" 2>&1)"; return 1 ;;
        esac
        [ $((SECONDS - start)) -lt 180 ] || { log "container $id still '$state' after 180 s"; return 1; }
        sleep 0.5
    done
}
# Seconds until GET /health answers 200 from the host (the server is up, before Docker's next check).
wait_answering() {
    local url=$1 start=$SECONDS
    until "$PY" -c "import sys; from tinycontext.servers.health import probe; sys.exit(0 if probe(sys.argv[1], sys.argv[2], 2)[0] else 1)" "$url" "$TOKEN"; do
        [ $((SECONDS - start)) -lt 180 ] || return 1
        sleep 0.2
    done
    echo $((SECONDS - start))
}
answer=$(wait_answering "$REST/health") && answer_mcp=$(wait_answering "${MCP%/mcp}/health") \
    || die "services did not answer /health: $(compose logs --tail 30 2>&1)"
note "cold start (compose up, image present): /health answers after $((SECONDS - t0))s"
healthy=$(wait_healthy "$(container_of mcp)") && wait_healthy "$(container_of rest)" >/dev/null \
    || die "services did not become healthy"
note "cold start: Docker reports both healthy after $((SECONDS - t0))s (HEALTHCHECK interval 10 s)"

# -- save, recall, auth, restart, stop under load -------------------------------------------------
client() { "$PY" "$CLIENT" "$@" --token "$TOKEN"; }
client basic --mcp "$MCP" --rest "$REST" >"$WORK/basic.json" && pass "MCP + REST save/recall, wrong or no token -> 401: $(cat "$WORK/basic.json")" \
    || fail "save/recall/auth: $(cat "$WORK/basic.json")"
[ "$(compose exec -T mcp id -u)" != 0 ] && pass "the running service is not root (uid $(compose exec -T mcp id -u))" || fail "service runs as root"

t0=$SECONDS
compose restart mcp >/dev/null 2>&1
wait_healthy "$(container_of mcp)" >/dev/null || die "mcp did not come back after restart"
client recall --mcp "$MCP" --expect "Deploys go out on Thursdays" >"$WORK/recall.json" \
    && pass "recall after restarting the container ($((SECONDS - t0))s to healthy): $(cat "$WORK/recall.json")" \
    || fail "recall after restart: $(cat "$WORK/recall.json")"

: >"$WORK/acked.jsonl"
client burst --mcp "$MCP" --out "$WORK/acked.jsonl" >"$WORK/burst.json" 2>"$WORK/burst.err" &
BURST=$!
for _ in $(seq 600); do [ "$(wc -l <"$WORK/acked.jsonl")" -ge 30 ] && break; sleep 0.1; done
t0=$SECONDS
mcp_id=$(container_of mcp)
compose stop mcp >/dev/null 2>&1
stop_s=$((SECONDS - t0))
for _ in $(seq 60); do kill -0 "$BURST" 2>/dev/null || break; sleep 1; done
kill "$BURST" 2>/dev/null || true  # only acknowledged saves count, and they are on file already
wait "$BURST" 2>/dev/null || true
code=$(command docker inspect -f '{{.State.ExitCode}}' "$mcp_id")
acked=$(wc -l <"$WORK/acked.jsonl")
command docker logs "$mcp_id" 2>&1 | grep -q "TinyContext stopped: requests finished, database checkpointed and closed" \
    && [ "$code" = 0 ] && pass "docker stop during a burst of saves: ${stop_s}s, exit code 0, clean-stop message logged ($acked saves acknowledged)" \
    || fail "docker stop during a burst: exit code $code, logs: $(command docker logs --tail 10 "$mcp_id" 2>&1)"
compose start mcp >/dev/null 2>&1
wait_healthy "$(container_of mcp)" >/dev/null || die "mcp did not come back after the stop"
client verify --rest "$REST" --acked "$WORK/acked.jsonl" >"$WORK/verify.json" \
    && pass "every acknowledged save is there after the restart: $(cat "$WORK/verify.json")" || fail "lost saves: $(cat "$WORK/verify.json")"

# -- save/recall latency from outside vs inside the container -------------------------------------
# Two rounds, alternating, so that the machine's changing load hits both sides alike.
for round in 1 2; do
    client bench --mcp "$MCP" --rest "$REST" >"$WORK/bench_outside_$round.json" || fail "bench outside: $(cat "$WORK/bench_outside_$round.json")"
    compose exec -T mcp python - bench --mcp http://127.0.0.1:8765/mcp --token "$TOKEN" <"$CLIENT" >"$WORK/bench_inside_mcp_$round.json" \
        || fail "bench inside (mcp): $(cat "$WORK/bench_inside_mcp_$round.json")"
    compose exec -T rest python - bench --rest http://127.0.0.1:8765 --token "$TOKEN" <"$CLIENT" >"$WORK/bench_inside_rest_$round.json" \
        || fail "bench inside (rest): $(cat "$WORK/bench_inside_rest_$round.json")"
    note "round $round, from the host through the published ports: $(cat "$WORK/bench_outside_$round.json")"
    note "round $round, inside the containers (loopback): $(cat "$WORK/bench_inside_mcp_$round.json") $(cat "$WORK/bench_inside_rest_$round.json")"
done
note "load average: $(cut -d' ' -f1-3 /proc/loadavg)"

# -- the token as a compose secret -----------------------------------------------------------------
printf '%s\n' "$TOKEN" >"$WORK/token.txt"
(
    export COMPOSE_PROJECT_NAME=${COMPOSE_PROJECT_NAME}secret TINYCONTEXT_API_TOKEN_SECRET=$WORK/token.txt MCP_PUBLISH_PORT=$(free_port)
    unset TINYCONTEXT_API_TOKEN
    compose -f compose.yaml -f compose.secret.yaml up -d mcp >"$WORK/secret_up.log" 2>&1 || exit 1
    wait_healthy "$(compose -f compose.yaml -f compose.secret.yaml ps -q mcp)" >/dev/null || exit 1
    client basic --mcp "http://127.0.0.1:$MCP_PUBLISH_PORT/mcp" >"$WORK/secret.json"
) && pass "token from a compose secret (compose.secret.yaml)" || fail "token as a secret: $(cat "$WORK/secret_up.log" "$WORK/secret.json" 2>/dev/null | tail -5)"

# -- bad input: a clear message, a non-zero exit, nothing stored touched ----------------------------
# run_fails NAME EXPECTED-TEXT docker-run-arguments...: the container must exit non-zero, saying EXPECTED-TEXT.
run_fails() {
    local name=$1 expected=$2 code
    shift 2
    set +e
    command docker run --name "${COMPOSE_PROJECT_NAME}_$name" "$@" >"$WORK/$name.log" 2>&1
    code=$?
    set -e
    # What `docker logs` shows, and for a container Docker could not start, what `docker run` said.
    local said
    said=$(command docker logs "${COMPOSE_PROJECT_NAME}_$name" 2>&1; echo; cat "$WORK/$name.log")
    if [ "$code" -ne 0 ] && grep -qF -- "$expected" <<<"$said"; then
        pass "$name: exit $code, says: $(grep -F -m1 -- "$expected" <<<"$said" | cut -c1-240)"
    else
        fail "$name: exit $code, expected '$expected' in: $said"
    fi
}
VOL=${COMPOSE_PROJECT_NAME}_bad
run_fails no-token "Refusing to listen on 0.0.0.0 without authentication" "$IMAGE"
run_fails short-token "must be at least 24 characters" -e TINYCONTEXT_API_TOKEN=short "$IMAGE"
command docker run --rm -v "$VOL:/data" --entrypoint sh "$IMAGE" -c 'head -c 65536 /dev/urandom > /data/memory.db && sha256sum /data/memory.db' >"$WORK/corrupt.sum"
run_fails corrupt-db "storage_error: Cannot use database /data/memory.db" -v "$VOL:/data" -e TINYCONTEXT_API_TOKEN="$TOKEN" "$IMAGE"
command docker run --rm -v "$VOL:/data" --entrypoint sha256sum "$IMAGE" /data/memory.db | cmp -s - "$WORK/corrupt.sum" \
    && pass "corrupt-db: the corrupt file is left byte for byte as it was" || fail "corrupt-db: the file was changed"
run_fails read-only-empty-volume "storage_error: Cannot open database /data/memory.db" -v "${VOL}_ro:/data:ro" -e TINYCONTEXT_API_TOKEN="$TOKEN" "$IMAGE"
compose stop >/dev/null 2>&1
run_fails read-only-data-volume "Its folder is not writable (a read-only volume or mount?)" \
    -v "${COMPOSE_PROJECT_NAME}_tinycontext-data:/data:ro" -e TINYCONTEXT_API_TOKEN="$TOKEN" "$IMAGE"
run_fails full-volume-at-start "database or disk is full. Free space on its disk or volume" --tmpfs "/data:size=64k,uid=$user,gid=$user" -e TINYCONTEXT_API_TOKEN="$TOKEN" "$IMAGE"

# A volume that fills up while serving: saves fail with storage_error, the server keeps answering, nothing is lost.
full_port=$(free_port)
command docker run -d --name "${COMPOSE_PROJECT_NAME}_full" -p "127.0.0.1:$full_port:8765" \
    --tmpfs "/data:size=8m,uid=$user,gid=$user" -e TINYCONTEXT_API_TOKEN="$TOKEN" "$IMAGE" >/dev/null
if wait_healthy "${COMPOSE_PROJECT_NAME}_full" >/dev/null && client basic --mcp "http://127.0.0.1:$full_port/mcp" >/dev/null; then
    command docker exec "${COMPOSE_PROJECT_NAME}_full" sh -c 'dd if=/dev/zero of=/data/filler bs=64k 2>/dev/null; true'
    "$PY" - "http://127.0.0.1:$full_port/mcp" "$TOKEN" >"$WORK/full.json" <<'EOF' && pass "full volume while serving: $(cat "$WORK/full.json")" || fail "full volume while serving: $(cat "$WORK/full.json")"
import json, sys
import anyio, httpx
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

async def main(url, token):
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60) as http:
        async with streamable_http_client(url, http_client=http) as (read, write, _), ClientSession(read, write) as session:
            await session.initialize()
            saved = await session.call_tool("save_memories", {"memories": [{"content": "x" * 50_000 + " too big for a full disk"}]})
            recall = await session.call_tool("recall_memories", {"query": "where is the agent memory kept?", "session_id": "smoke"})
            return saved, recall

saved, recall = anyio.run(main, *sys.argv[1:])
error = saved.content[0].text
ok = saved.isError and error.startswith("storage_error") and "disk is full" in error and not recall.isError \
     and "SQLite file" in recall.content[0].text
print(json.dumps({"save": error[:160], "recall_still_works": not recall.isError}))
sys.exit(0 if ok else 1)
EOF
    if command docker exec "${COMPOSE_PROJECT_NAME}_full" rm /data/filler && client basic --mcp "http://127.0.0.1:$full_port/mcp" >/dev/null; then
        pass "full volume: saves work again once space is freed, without a restart"
    else
        fail "full volume: saves do not recover after freeing space"
    fi
    [ "$(command docker inspect -f '{{.RestartCount}} {{.State.Status}}' "${COMPOSE_PROJECT_NAME}_full")" = "0 running" ] \
        && pass "full volume: the container never crashed" || fail "full volume: the container crashed"
else
    fail "full volume: the container did not start: $(command docker logs --tail 20 "${COMPOSE_PROJECT_NAME}_full" 2>&1)"
fi

# A host port already taken: Docker refuses to start the container and says why.
busy_port=$(free_port)
"$PY" -c "import socket, time; s = socket.socket(); s.bind(('127.0.0.1', $busy_port)); s.listen(); time.sleep(600)" &
HOLDER_PID=$!
sleep 1
run_fails port-in-use "address already in use" -p "127.0.0.1:$busy_port:8765" -e TINYCONTEXT_API_TOKEN="$TOKEN" "$IMAGE"
kill "$HOLDER_PID"; HOLDER_PID=
