"""Hostile input over real HTTP: every case gets a clear 4xx or a correct result, the server stays
up, sessions stay isolated, and data saved before the barrage is unchanged afterwards."""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from consistency import assert_consistent

from tinycontext.servers.fastapi_server import create_app
from tinycontext.servers.http import ServeSettings, background

NASTY = [
    "", " ", "\t\r\n", "a OR b", "a AND NOT b", "NEAR(a b, 2)", '"unbalanced', "'single", '""', "content:secret",
    "memories_fts", "*", "a*", "^start", "(((", ")", "-x", "+y", "NULL", "'; DROP TABLE memories; --", "\\", "%_%",
    "a\u0000b", "\u0000", "\ud800", "x\udfffy", "\u202etxet lrt", "\u200b", "e\u0301", "💥" * 50, "<script>alert(1)</script>",
    "{{7*7}}", "${jndi:ldap://x}", "../../etc/passwd", "SELECT * FROM memories", "x" * 250, "word " * 30_000,
    "\uffff\ufffe", "ä" * 1000, "MATCH", "vec0", "1e309", "-0", "true",
]
WRONG = [None, True, 1.5, -1, 2**70, "s", [], {}, [1], {"a": 1}, [[[]]], "12"]
BUDGETS = [-(10**18), -1, 0, 1, 1000, 10**6, 10**6 + 1, 10**18, 2**63, 2**64]
BAD_IDS = [0, -1, 2**63, 10**30, 987_654, "1", 1.0, None, True, [1]]
ENDPOINTS = ["/save_memories", "/recall_memories", "/update_memory", "/delete_memory", "/get_memory"]
RAW = [b"", b"\xff\xfe\xfd", b'{"query": "\xc3\x28"}', b'{"query": ', b"[]", b"42", b"null", b"\x00" * 10,
       b"\xef\xbb\xbf{}", b'{"query": "x"}' * 2, b'{"a": ' * 2000 + b"1" + b"}" * 2000]


def _cases(victim: int) -> list[tuple[str, object]]:
    cases: list[tuple[str, object]] = []
    for s in NASTY:
        cases += [
            ("/save_memories", {"session_id": "hostile", "memories": [{"content": s}]}),
            ("/save_memories", {"session_id": s, "memories": [{"content": "probe for session names"}]}),
            ("/save_memories", {"session_id": "hostile", "memories": [{"content": "tagged probe", "tags": [s]}]}),
            ("/save_memories", {"session_id": "hostile", "memories": [{"content": "meta probe", "metadata": {s: s}}]}),
            ("/recall_memories", {"query": s, "session_id": "hostile"}),
            ("/recall_memories", {"query": s}),
            ("/recall_memories", {"query": "probe", "session_id": s}),
            ("/recall_memories", {"query": "probe", "tags": [s]}),
            ("/update_memory", {"id": victim, "content": s}),
        ]
    fields = {"/save_memories": ["memories", "session_id"], "/recall_memories": ["query", "session_id", "max_tokens", "top_k", "tags", "offset"],
              "/update_memory": ["content", "tags", "metadata"]}
    base = {"/save_memories": {"memories": [{"content": "typed probe"}], "session_id": "hostile"},
            "/recall_memories": {"query": "probe", "session_id": "hostile"}, "/update_memory": {"id": victim}}
    for path, names in fields.items():
        for name in names:
            cases += [(path, {**base[path], name: value}) for value in WRONG]
    for key in ("content", "tags", "metadata"):
        cases += [("/save_memories", {"session_id": "hostile", "memories": [{"content": "typed probe", key: value}]}) for value in WRONG]
    for name in ("max_tokens", "top_k", "offset"):
        cases += [("/recall_memories", {"query": "probe", name: value}) for value in BUDGETS]
    for path in ("/update_memory", "/delete_memory", "/get_memory"):
        cases += [(path, {"id": value}) for value in BAD_IDS]
    for depth in (5, 16, 17, 100, 500):
        nested: object = "leaf"
        for _ in range(depth):
            nested = {"k": nested}
        cases.append(("/save_memories", {"session_id": "hostile", "memories": [{"content": f"nested {depth}", "metadata": nested}]}))
    cases += [
        ("/save_memories", {"session_id": "hostile", "memories": [{"content": "x" * 1_000_000}]}),
        ("/save_memories", {"session_id": "hostile", "memories": [{"content": f"bulk {i}"} for i in range(1001)]}),
        ("/save_memories", {"session_id": "hostile", "memories": [{"content": f"bulk {i}"} for i in range(100_000)]}),
        ("/save_memories", {"session_id": "hostile", "memories": [{"content": "many tags", "tags": [f"t{i}" for i in range(65)]}]}),
        ("/save_memories", {"session_id": "hostile", "memories": [{"content": "x", "extra": 1}], "more": 2}),
    ]
    cases += [(path, raw) for path in ENDPOINTS for raw in RAW]
    return cases


def _check(client: httpx.Client, response: httpx.Response, path: str, body) -> None:
    assert response.status_code in (200, 400, 404, 413, 422), (path, body if not isinstance(body, bytes) else body[:50], response.text[:300])
    data = response.json()
    if response.status_code != 200:
        assert set(data) >= {"code", "message"} and data["message"], data
        return
    if path == "/recall_memories" and isinstance(body, dict) and isinstance(body.get("session_id"), str):
        sessions = {client.post("/get_memory", json={"id": m["id"]}).json()["session_id"] for m in data["memories"]}
        assert sessions <= {body["session_id"]}  # isolation
    if path == "/save_memories":
        sent = body["memories"]
        assert [sent[s["index"]]["content"].strip() for s in data["saved"]] == \
               [m["content"] for m in (client.post("/get_memory", json={"id": i}).json() for i in data["ids"])]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from conftest import suite_embedder
    from tinycontext import MemoryEngine, TinyContextConfig

    tmp = tmp_path_factory.mktemp("hostile")
    config = TinyContextConfig(memory_db_path=tmp / "h.db", models_dir=tmp / "models")
    with MemoryEngine(config, embedder=suite_embedder()) as engine:
        with background(create_app(engine=engine, settings=ServeSettings())) as base, httpx.Client(base_url=base, timeout=60) as client:
            baseline = client.post("/save_memories", json={"session_id": "private", "memories": [
                {"content": "The vault code is in the blue notebook", "tags": ["secret"], "metadata": {"k": [1, {"x": None}]}},
                {"content": "probe: this private memory must never leak into other sessions"}]}).json()["ids"]
            victim = client.post("/save_memories", json={"session_id": "hostile", "memories": [{"content": "victim"}]}).json()["ids"][0]
            before = [client.post("/get_memory", json={"id": i}).json() for i in baseline]
            yield client, engine, victim
            assert [client.post("/get_memory", json={"id": i}).json() for i in baseline] == before
            assert_consistent(engine)


def test_table_corpus(server):
    client, _engine, victim = server
    cases = _cases(victim)
    assert len(cases) >= 650  # plus 350 generated cases below: over 1,000 in all
    for path, body in cases:
        if isinstance(body, bytes):
            response = client.post(path, content=body, headers={"content-type": "application/json"})
        else:
            # ensure_ascii keeps lone surrogates as \\ud800 escapes, the way a hostile client would send them
            response = client.post(path, content=json.dumps(body).encode(), headers={"content-type": "application/json"})
        _check(client, response, path, body)
    assert client.get("/health").json()["status"] == "ok"


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
FIELDS = {"query": st.text(max_size=60) | JSON, "session_id": st.sampled_from(["hostile", "private", "nobody"]) | JSON,
          "max_tokens": st.integers() | JSON, "top_k": st.integers(-5, 2000) | JSON, "tags": st.lists(st.text(max_size=5), max_size=3) | JSON,
          "offset": st.integers() | JSON, "memories": st.lists(st.fixed_dictionaries({"content": st.text(max_size=40)}), max_size=3) | JSON,
          "id": st.integers() | JSON, "content": st.text(max_size=40) | JSON, "metadata": JSON}


@settings(max_examples=350, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(path=st.sampled_from(["/save_memories", "/recall_memories", "/get_memory"]), body=st.dictionaries(st.sampled_from(sorted(FIELDS)), JSON, max_size=4),
       typed=st.fixed_dictionaries({}, optional=FIELDS))
def test_generated_bodies(server, path, body, typed):
    client = server[0]
    payload = {**body, **typed}
    if path == "/save_memories" and isinstance(payload.get("session_id"), str) and payload["session_id"] == "private":
        payload["session_id"] = "hostile"  # keep the baseline session untouched
    response = client.post(path, content=json.dumps(payload).encode(), headers={"content-type": "application/json"})
    _check(client, response, path, payload)
