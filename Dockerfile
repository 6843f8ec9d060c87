# TinyContext as a shared memory service: MCP over Streamable HTTP on port 8765 (default) or the
# REST API (`serve --rest`), data in the /data volume. Quickstart: README.md, section Docker.
#
#   docker build -t tinycontext .
#   docker build -t tinycontext --build-arg BASE_IMAGE=my-debian-python --secret id=ca,src=/path/ca.pem .
#   docker build -t tinycontext --build-arg EXTRAS=server,otel,remote .
#
# BASE_IMAGE: any Debian-like image with python3 >= 3.11 and its venv module: python:3.12-slim, or a plain
# Debian made with `debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates` and
# `docker import` (scripts/docker_smoke.sh does that); the venv's own pip is used as it ships. The optional `ca`
# secret is a CA bundle for pip behind a TLS-inspecting proxy; it is used by pip only, never stored.
ARG BASE_IMAGE=python:3.12-slim

FROM ${BASE_IMAGE} AS build
# The extras the service needs: the servers (MCP over HTTP and REST, with the MCP tools and web evidence)
# and OpenTelemetry export (configured from OTEL_* at start). Add browser for the browser tools (they also
# need a Chromium in the image), remote for embedding servers.
ARG EXTRAS=server,otel
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PIP_DEFAULT_TIMEOUT=180
WORKDIR /src
# Dependencies first, from pyproject alone, so that a code change does not reinstall them: the core's and
# those of EXTRAS, following extras that name others (tinycontext[mcp], tinycontext[a,b]).
COPY pyproject.toml ./
RUN --mount=type=secret,id=ca \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi \
    && python3 -m venv /opt/venv \
    && python3 -c "import sys, tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; x = p['optional-dependencies']; \
extra = lambda n: [e for d in x[n] for e in ([f for m in d[12:-1].split(',') for f in extra(m)] if d.startswith('tinycontext[') else [d])]; \
print('\n'.join(p['dependencies'] + sorted({d for n in sys.argv[1].split(',') for d in extra(n.strip())})))" "$EXTRAS" > requirements.txt \
    && cat requirements.txt \
    && /opt/venv/bin/pip install --quiet -r requirements.txt
COPY README.md LICENSE NOTICE ./
COPY tinycontext ./tinycontext
COPY evals ./evals
RUN --mount=type=secret,id=ca \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi \
    && /opt/venv/bin/pip install --quiet --no-deps . \
    && /opt/venv/bin/pip uninstall --quiet --yes pip \
    && /opt/venv/bin/python -m compileall -q /opt/venv/lib \
    # The bundled model, tokenizer and o200k encoding must work offline: fail the build, not the first start.
    && cd /tmp && HF_HUB_OFFLINE=1 /opt/venv/bin/python -c "import pathlib, tempfile; from tinycontext import MemoryEngine, TinyContextConfig; \
d = pathlib.Path(tempfile.mkdtemp()); e = MemoryEngine(TinyContextConfig(memory_db_path=d / 'm.db', models_dir=d / 'models')); \
e.save('The image works offline'); assert e.recall('does the image work')['memories']; e.close()"

FROM ${BASE_IMAGE}
RUN groupadd --system --gid 10001 tinycontext \
    && useradd --system --uid 10001 --gid tinycontext --home-dir /data --no-create-home --shell /usr/sbin/nologin tinycontext \
    && mkdir /data && chown tinycontext:tinycontext /data
COPY --from=build /opt/venv /opt/venv
# Every TINYCONTEXT_<SETTING> of README's Configuration table works too (docker run -e, compose environment).
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HOME=/data \
    MCP_TRANSPORT=streamable-http \
    MCP_HOST=0.0.0.0 \
    MCP_PORT=8765 \
    TINYCONTEXT_MEMORY_DB_PATH=/data/memory.db \
    TINYCONTEXT_MODELS_DIR=/data/models \
    HF_HUB_DISABLE_TELEMETRY=1
VOLUME /data
WORKDIR /data
USER tinycontext:tinycontext
EXPOSE 8765
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-m", "tinycontext.servers.health"]
# uvicorn handles SIGTERM: in-flight requests finish, then the database is checkpointed and closed.
STOPSIGNAL SIGTERM
ENTRYPOINT ["tinycontext"]
CMD ["serve"]
