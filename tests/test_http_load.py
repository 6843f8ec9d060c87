"""Concurrent client processes against one server: every acknowledged save is stored exactly once,
and recalls stay within their session."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

from tinycontext.servers.fastapi_server import create_app
from tinycontext.servers.http import ServeSettings, background

CLIENTS = 6
ROUNDS = 15

CLIENT = """
import json, sys, httpx
base, me, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
acked, leaks = [], 0
with httpx.Client(base_url=base, timeout=60) as client:
    for r in range(rounds):
        memories = [{"content": f"client {me} round {r} fact {i} about shared topic"} for i in range(4)]
        saved = client.post("/save_memories", json={"session_id": f"c{me}", "memories": memories})
        saved.raise_for_status()
        acked += [[i, memories[s["index"]]["content"]] for i, s in zip(saved.json()["ids"], saved.json()["saved"])]
        recall = client.post("/recall_memories", json={"query": "shared topic fact", "session_id": f"c{me}", "top_k": 20, "detail": "full"})
        recall.raise_for_status()
        leaks += sum(m["session_id"] != f"c{me}" for m in recall.json()["memories"])
print(json.dumps({"acked": acked, "leaks": leaks}))
"""


def test_concurrent_clients_every_ack_stored_once(hash_engine):
    with background(create_app(engine=hash_engine, settings=ServeSettings())) as base:
        procs = [subprocess.Popen([sys.executable, "-c", CLIENT, base, str(n), str(ROUNDS)], stdout=subprocess.PIPE, text=True)
                 for n in range(CLIENTS)]
        results = []
        for proc in procs:
            out, _ = proc.communicate(timeout=180)
            assert proc.returncode == 0
            results.append(json.loads(out))
    assert sum(r["leaks"] for r in results) == 0
    acked = [tuple(pair) for r in results for pair in r["acked"]]
    assert len(acked) == CLIENTS * ROUNDS * 4
    rows = dict(hash_engine.store.read("SELECT id, content FROM memories"))
    assert all(rows.get(mid) == content for mid, content in acked)
    assert Counter(rows.values()) == Counter(content for _, content in acked)  # nothing twice, nothing extra
    vectors = hash_engine.store.read("SELECT count(*) FROM memory_vectors")[0][0]
    assert vectors == len(rows) == len(acked)
