"""Client side of scripts/docker_smoke.sh: drives a TinyContext server with the official MCP SDK
(Streamable HTTP, bearer token) and its REST API. Runs on the host or, piped to ``python -``,
inside the container (it needs only mcp and httpx, which the image has). Prints one JSON line per
command and exits 1 when a check fails.

    python scripts/docker_smoke_client.py basic  --mcp URL [--rest URL] --token T
    python scripts/docker_smoke_client.py recall --mcp URL --token T --expect TEXT
    python scripts/docker_smoke_client.py burst  --mcp URL --token T --out FILE   (until the server goes away)
    python scripts/docker_smoke_client.py verify --mcp URL --token T --acked FILE
    python scripts/docker_smoke_client.py bench  [--mcp URL] [--rest URL] --token T [--n 40]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import timedelta

import anyio
import httpx
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

FACTS = [
    "The team stores agent memory in one SQLite file on the shared volume",
    "Deploys go out on Thursdays after the release check passes",
    "Alice prefers short answers with code first",
]


class CheckFailed(Exception):
    pass


def check(condition: bool, what: str) -> None:
    if not condition:
        raise CheckFailed(what)


async def with_session(url: str, token: str | None, work):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx.AsyncClient(headers=headers, timeout=60) as http:
        async with streamable_http_client(url, http_client=http) as (read, write, _):
            # A call cut off by a stopping server must end, not wait for an answer forever.
            async with ClientSession(read, write, read_timeout_seconds=timedelta(seconds=30)) as session:
                await session.initialize()
                return await work(session)


def status_of(method: str, url: str, token: str | None, body: dict | None = None) -> int:
    headers = {"Accept": "application/json, text/event-stream"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return httpx.request(method, url, json=body, headers=headers, timeout=30).status_code


async def basic(args) -> dict:
    async def work(session: ClientSession) -> dict:
        tools = {tool.name for tool in (await session.list_tools()).tools}
        saved = await session.call_tool("save_memories", {"session_id": "smoke", "memories": [{"content": f} for f in FACTS]})
        check(not saved.isError, f"MCP save failed: {saved.content}")
        recall = await session.call_tool("recall_memories", {"query": "where is the agent memory kept?", "session_id": "smoke"})
        check(not recall.isError, f"MCP recall failed: {recall.content}")
        text = recall.content[0].text
        check(text.splitlines()[0].startswith("- " + FACTS[0]), f"MCP recall did not rank the SQLite fact first:\n{text}")
        return {"tools": sorted(tools), "saved_ids": saved.structuredContent["ids"], "recall_first_line": text.splitlines()[0]}

    result = await with_session(args.mcp, args.token, work)
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                  "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "smoke", "version": "0"}}}
    result["mcp_wrong_token"] = status_of("POST", args.mcp, "wrong-" + args.token, initialize)
    result["mcp_no_token"] = status_of("POST", args.mcp, None, initialize)
    check(result["mcp_wrong_token"] == 401 and result["mcp_no_token"] == 401, f"MCP without the right token: {result}")
    if args.rest:
        auth = {"Authorization": f"Bearer {args.token}"}
        saved = httpx.post(args.rest + "/save_memories", headers=auth, timeout=60,
                           json={"session_id": "smoke-rest", "memories": [{"content": "The REST profile shares the volume with MCP"}]})
        check(saved.status_code == 200, f"REST save: {saved.status_code} {saved.text}")
        recall = httpx.post(args.rest + "/recall_memories", headers=auth, timeout=60, json={"query": "agent memory SQLite file"})
        check(recall.status_code == 200, f"REST recall: {recall.status_code} {recall.text}")
        contents = json.dumps(recall.json())
        # The REST service reads what the MCP service saved: one database on the shared volume.
        check(FACTS[0] in contents, f"REST recall does not see the MCP save: {contents[:500]}")
        result["rest_saved_ids"] = saved.json()["ids"]
        result["rest_wrong_token"] = status_of("POST", args.rest + "/recall_memories", "wrong-" + args.token, {"query": "x"})
        result["rest_no_token"] = status_of("POST", args.rest + "/recall_memories", None, {"query": "x"})
        check(result["rest_wrong_token"] == 401 and result["rest_no_token"] == 401, f"REST without the right token: {result}")
    return result


async def recall(args) -> dict:
    async def work(session: ClientSession) -> dict:
        found = await session.call_tool("recall_memories", {"query": args.expect, "session_id": "smoke"})
        text = found.content[0].text
        check(not found.isError and args.expect in text, f"{args.expect!r} not recalled:\n{text}")
        return {"recalled": text.splitlines()[0]}

    return await with_session(args.mcp, args.token, work)


async def burst(args) -> dict:
    """Concurrent single-memory saves until the server goes away; every acknowledged save is
    appended to --out (id, content) as soon as it is acknowledged."""
    acknowledged = 0

    async def worker(n: int, out) -> None:
        nonlocal acknowledged

        async def work(session: ClientSession) -> None:
            nonlocal acknowledged
            for i in range(1_000_000):
                content = f"burst {n}-{i}: build {i % 23} passed on runner {n}"
                saved = await session.call_tool("save_memories", {"session_id": "burst", "memories": [{"content": content}]})
                if saved.isError:
                    return
                out.write(json.dumps([saved.structuredContent["ids"][0], content]) + "\n")
                out.flush()
                acknowledged += 1

        try:
            await with_session(args.mcp, args.token, work)
        except Exception:  # noqa: BLE001 - the server stopping ends the burst; only acknowledged saves count
            pass

    with open(args.out, "w", encoding="utf-8") as out:
        async with anyio.create_task_group() as group:
            for n in range(args.workers):
                group.start_soon(worker, n, out)
    return {"acknowledged": acknowledged}


async def verify(args) -> dict:
    """Every acknowledged save, read back by id through the REST API (the MCP server's default tool
    profile has no get_memory); the REST service reads the same volume."""
    with open(args.acked, encoding="utf-8") as file:
        acked = [json.loads(line) for line in file if line.strip()]
    lost = []
    with httpx.Client(base_url=args.rest, headers={"Authorization": f"Bearer {args.token}"}, timeout=60) as client:
        for memory_id, content in acked:
            got = client.post("/get_memory", json={"id": memory_id})
            if got.status_code != 200 or got.json().get("content") != content:
                lost.append(memory_id)
    result = {"acknowledged": len(acked), "lost": lost}
    check(acked and not result["lost"], f"acknowledged saves missing after the restart: {result}")
    return result


def _summary(samples: list[float]) -> dict:
    ordered = sorted(samples)
    return {"n": len(samples), "p50_ms": round(statistics.median(ordered), 2),
            "p95_ms": round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 2)}


async def bench(args) -> dict:
    """Latency of one save and one recall, median of --n calls each, on a warm connection."""
    stamp = time.time_ns()

    async def work(session: ClientSession) -> dict:
        saves, recalls = [], []
        for i in range(args.n):
            started = time.perf_counter()
            saved = await session.call_tool("save_memories", {"session_id": "bench", "memories": [
                {"content": f"bench {stamp}-{i}: the nightly job {i} writes its report to bucket {i % 7}"}]})
            saves.append((time.perf_counter() - started) * 1000)
            check(not saved.isError, f"bench save failed: {saved.content}")
        for i in range(args.n):
            started = time.perf_counter()
            found = await session.call_tool("recall_memories", {"query": f"where does nightly job {i} write?", "session_id": "bench"})
            recalls.append((time.perf_counter() - started) * 1000)
            check(not found.isError, f"bench recall failed: {found.content}")
        return {"mcp_save": _summary(saves), "mcp_recall": _summary(recalls)}

    result = await with_session(args.mcp, args.token, work) if args.mcp else {}
    if args.rest:
        saves, recalls = [], []
        with httpx.Client(base_url=args.rest, headers={"Authorization": f"Bearer {args.token}"}, timeout=60) as client:
            for i in range(args.n):
                started = time.perf_counter()
                client.post("/save_memories", json={"session_id": "bench-rest", "memories": [
                    {"content": f"rest bench {stamp}-{i}: the nightly job {i} writes to bucket {i % 7}"}]}).raise_for_status()
                saves.append((time.perf_counter() - started) * 1000)
            for i in range(args.n):
                started = time.perf_counter()
                client.post("/recall_memories", json={"query": f"nightly job {i}", "session_id": "bench-rest"}).raise_for_status()
                recalls.append((time.perf_counter() - started) * 1000)
        result.update(rest_save=_summary(saves), rest_recall=_summary(recalls))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["basic", "recall", "burst", "verify", "bench"])
    parser.add_argument("--mcp", help="MCP endpoint, e.g. http://127.0.0.1:8765/mcp (bench: optional)")
    parser.add_argument("--rest", help="REST base URL (verify: required)")
    parser.add_argument("--token", required=True)
    parser.add_argument("--expect")
    parser.add_argument("--out")
    parser.add_argument("--acked")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--n", type=int, default=40)
    args = parser.parse_args(argv)
    if args.command == "verify" and not args.rest:
        parser.error("verify needs --rest")
    if args.command not in ("bench", "verify") and not args.mcp:
        parser.error(f"{args.command} needs --mcp")
    try:
        result = anyio.run(globals()[args.command], args)
    except CheckFailed as failed:
        print(json.dumps({"command": args.command, "ok": False, "error": str(failed)}))
        return 1
    print(json.dumps({"command": args.command, "ok": True, **result}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
