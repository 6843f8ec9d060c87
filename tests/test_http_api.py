"""The REST app over real HTTP (uvicorn on loopback, httpx): endpoints, error mapping, auth, limits."""

from __future__ import annotations

import importlib
import sys

import httpx
import pytest

from tinycontext.servers.fastapi_server import create_app
from tinycontext.servers.http import ServeSettings, background

TOKEN = "rest-api-test-token-0123456789"


@pytest.fixture
def api(hash_engine):
    with background(create_app(engine=hash_engine, settings=ServeSettings())) as base:
        with httpx.Client(base_url=base, timeout=30) as client:
            yield client


def test_tools_round_trip(api):
    saved = api.post("/save_memories", json={"session_id": "proj", "memories": [
        {"content": "The staging database is Postgres 16", "tags": ["db"], "metadata": {"source": "chat"}},
        {"content": "Releases happen on Tuesdays"}]})
    assert saved.status_code == 200
    first, second = saved.json()["ids"]
    recall = api.post("/recall_memories", json={"query": "which database for staging", "session_id": "proj", "detail": "full"}).json()
    assert recall["memories"][0]["id"] == first and recall["memories"][0]["metadata"] == {"source": "chat"}
    updated = api.post("/update_memory", json={"id": first, "content": "The staging database is Postgres 17"}).json()
    assert updated["version"] == 2 and updated["history"][0]["content"].endswith("16")
    assert api.post("/get_memory", json={"id": first}).json()["content"].endswith("17")
    assert api.post("/delete_memory", json={"id": second}).json() == {"id": second, "deleted": True}
    health = api.get("/health").json()
    assert health["status"] == "ok" and health["memories"] == 1 and health["embedder"] == "hash-test"
    paths = api.get("/openapi.json").json()["paths"]
    assert {"/health", "/save_memories", "/recall_memories", "/update_memory", "/delete_memory", "/get_memory"} <= set(paths)
    assert api.get("/docs").status_code == 200


def test_get_and_update_return_conversation_fields(api):
    turn = {"content": "I adopted a puppy", "speaker": "Caroline", "occurred_at": "2023-05-08T13:56",
            "attachments": ["a photo of a dog"], "episode": "chat-1"}
    memory_id = api.post("/save_memories", json={"memories": [turn]}).json()["ids"][0]
    for answer in (api.post("/get_memory", json={"id": memory_id}).json(),
                   api.post("/update_memory", json={"id": memory_id, "tags": ["pets"]}).json()):
        assert {key: answer[key] for key in turn} == turn


@pytest.mark.parametrize("path, body, status, code", [
    ("/save_memories", {"memories": []}, 400, "empty_memory"),
    ("/save_memories", {"memories": [{"content": "   "}]}, 400, "empty_memory"),
    ("/save_memories", {"memories": [{"content": "x\u0000y"}]}, 400, "invalid_input"),
    ("/save_memories", {"memories": [{"content": "x", "colour": "red"}]}, 422, "invalid_input"),
    ("/save_memories", {"memories": "not a list"}, 422, "invalid_input"),
    ("/recall_memories", {"query": "x", "max_tokens": 0}, 400, "recall_budget"),
    ("/recall_memories", {"query": "x", "max_tokens": 10**12}, 400, "recall_budget"),
    ("/recall_memories", {"query": "x", "top_k": 0}, 400, "invalid_input"),
    ("/recall_memories", {"query": "x", "top_k": "3"}, 422, "invalid_input"),
    ("/recall_memories", {"query": "x", "offset": -1}, 400, "invalid_input"),
    ("/recall_memories", {"query": ""}, 400, "invalid_input"),
    ("/recall_memories", {"query": "x", "session_id": "nobody"}, 404, "session_not_found"),
    ("/get_memory", {"id": 424242}, 404, "memory_not_found"),
    ("/get_memory", {"id": True}, 422, "invalid_input"),
    ("/delete_memory", {"id": -5}, 404, "memory_not_found"),
    ("/update_memory", {"id": 424242, "content": "x"}, 404, "memory_not_found"),
])
def test_errors_map_to_status_and_code(api, path, body, status, code):
    response = api.post(path, json=body)
    assert (response.status_code, response.json()["code"]) == (status, code)
    assert response.json()["message"]


def test_body_limits_and_malformed_json(hash_engine):
    settings = ServeSettings(max_body_bytes=10_000)
    with background(create_app(engine=hash_engine, settings=settings)) as base, httpx.Client(base_url=base) as client:
        big = {"memories": [{"content": "word " * 3000}]}
        assert client.post("/save_memories", json=big).status_code == 413

        def chunks():  # no Content-Length: the streamed bytes are counted instead
            for _ in range(20):
                yield b" " * 1000

        streamed = client.post("/save_memories", content=chunks(), headers={"content-type": "application/json"})
        assert (streamed.status_code, streamed.json()["code"]) == (413, "payload_too_large")
        for raw in (b'{"query": "\xff\xfe"}', b'{"query": ', b"\x00\x00"):
            response = client.post("/recall_memories", content=raw, headers={"content-type": "application/json"})
            assert response.status_code in (400, 422) and response.json()["code"] == "invalid_input"
        assert client.get("/health").status_code == 200


def test_token_checked_on_every_request(hash_engine):
    settings = ServeSettings(token=TOKEN)
    with background(create_app(engine=hash_engine, settings=settings)) as base:
        for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": f"Basic {TOKEN}"}, {"Authorization": TOKEN}):
            for method, path in (("GET", "/health"), ("POST", "/recall_memories"), ("GET", "/openapi.json")):
                response = httpx.request(method, base + path, headers=headers, json={"query": "x"})
                assert response.status_code == 401 and response.json()["code"] == "unauthorized"
                assert response.headers["www-authenticate"].startswith("Bearer")
                assert TOKEN not in response.text
        ok = httpx.get(base + "/health", headers={"Authorization": f"Bearer {TOKEN}"})
        assert ok.status_code == 200


def test_module_app_opens_nothing_at_import(monkeypatch, tmp_path):
    db = tmp_path / "lazy.db"
    monkeypatch.setenv("TINYCONTEXT_MEMORY_DB_PATH", str(db))
    monkeypatch.setenv("TINYCONTEXT_EMBEDDING_MODEL", str(tmp_path / "no-such-model"))
    sys.modules.pop("tinycontext.servers.fastapi_server", None)
    module = importlib.import_module("tinycontext.servers.fastapi_server")
    assert not db.exists()
    with background(module.app) as base:
        response = httpx.get(base + "/health")
    assert (response.status_code, response.json()["code"]) == (503, "model_unavailable")
    assert "no-such-model" in response.json()["message"]


def test_cors_preflight_for_configured_origin_only(hash_engine):
    settings = ServeSettings(token=TOKEN, cors_origins=("http://app.test",))
    with background(create_app(engine=hash_engine, settings=settings)) as base:
        preflight = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization,content-type"}
        allowed = httpx.options(base + "/recall_memories", headers={"Origin": "http://app.test", **preflight})
        assert allowed.status_code == 200 and allowed.headers["access-control-allow-origin"] == "http://app.test"
        other = httpx.options(base + "/recall_memories", headers={"Origin": "http://evil.test", **preflight})
        assert "access-control-allow-origin" not in other.headers


@pytest.mark.parametrize("origin", ["http://127.0.0.1:1", "http://localhost:3000", "http://[::1]:8080", "null"])
def test_writes_from_another_origins_page_are_refused_and_write_nothing(api, hash_engine, origin):
    # What a page of another local server can send without a preflight: a JSON or a text/plain POST.
    for kwargs in ({"json": {"memories": [{"content": "planted"}]}},
                   {"content": '{"memories": [{"content": "planted"}]}', "headers": {"Content-Type": "text/plain"}}):
        headers = {**kwargs.pop("headers", {}), "Origin": origin}
        answer = api.post("/save_memories", headers=headers, **kwargs)
        assert (answer.status_code, answer.json()["code"]) == (403, "invalid_origin")
    assert hash_engine.stats()["memories"] == 0


def test_this_servers_own_origin_and_clients_without_one_may_write(api, hash_engine):
    own = str(api.base_url).rstrip("/")
    assert api.post("/save_memories", json={"memories": [{"content": "from the page"}]}, headers={"Origin": own}).status_code == 200
    assert api.post("/save_memories", json={"memories": [{"content": "from a script"}]}).status_code == 200  # no Origin: not a browser page
    assert hash_engine.stats()["memories"] == 2
