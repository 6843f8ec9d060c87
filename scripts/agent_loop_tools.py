"""Which MCP tools a memory agent loop calls, and what each tools profile costs it per request.

A scripted agent follows the server's instructions over LoCoMo dev (5 real two-person conversations, their
999 questions) through the real stdio server (`tinycontext mcp`, every capability listed) and the SDK's client:

- at the start of each chat session it recalls with the session's first turn ("recall before answering");
- it saves the session in one save_memories call, one turn per memory with speaker and occurred_at;
- a near-duplicate the save reports is a correction the instructions send to update_memory: it calls it;
- it recalls once per question (the questions people ask about the conversation later).

No model decides here, so this counts what the workload asks for, not a model's habits. Printed: calls per
tool, answer tokens, and per profile the tool definitions every request carries (tinycontext.tool_schema_tokens)
and the total an agent pays over the run. Usage: python scripts/agent_loop_tools.py [--out notes/agent_loop.json]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_locomo import sessions  # noqa: E402  (the README's conversation recipe, shared with the LoCoMo benchmark)

from tinycontext import TinyContextConfig, tool_schema_tokens  # noqa: E402
from tinycontext.budget.tokens import get_encoding  # noqa: E402

SHARED = Path(__file__).resolve().parents[2] / "shared"
PROFILES = ["memory", "memory,manage", "memory,manage,web", "all"]

# The other way to offer `manage`: one tool with an `action` argument (TinySearch folds its browser so), written
# as tightly as the six separate tools, for the same operations and arguments.
FOLDED_MANAGE = {
    "name": "manage_memories",
    "description": "Manage saved memories. get id (with history); update id (content, tags, metadata; only those given "
                   "change; expected_version refuses if it changed); delete id; list (newest first, no query; offset "
                   "pages on); sessions; forget: delete by session, tags or filters, a dry run first (default), then "
                   "dry_run false with confirm=the count.",
    "input_schema": {"type": "object", "properties": {
        "action": {"enum": ["get", "update", "delete", "list", "sessions", "forget"]},
        "id": {"type": "integer"}, "content": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}},
        "metadata": {"type": "object"}, "expected_version": {"type": "integer"},
        "session_id": {"type": "string"},
        "filters": {"type": "object", "description": "tags_any, tags_all, metadata {k: v}, created_at/updated_at/occurred_at {gte, gt, lte, lt}"},
        "order": {"enum": ["newest", "oldest", "id"]}, "offset": {"type": "integer"}, "limit": {"type": "integer"},
        "max_tokens": {"type": "integer"}, "detail": {"enum": ["compact", "full"]}, "dry_run": {"type": "boolean"},
        "confirm": {"type": "integer"}}, "required": ["action"]},
}


def folded_tokens() -> int:
    return len(get_encoding("o200k_base").encode_ordinary(json.dumps(FOLDED_MANAGE, separators=(",", ":"), ensure_ascii=False)))


async def loop(conversations: list[dict], env: dict[str, str]) -> tuple[collections.Counter, collections.Counter, int]:
    calls, answer_tokens, near = collections.Counter(), collections.Counter(), 0
    enc = get_encoding("o200k_base")
    params = StdioServerParameters(command=sys.executable, args=["-m", "tinycontext", "mcp"], env=env)
    async with stdio_client(params) as (read, write), ClientSession(read, write) as client:
        await client.initialize()

        async def call(name: str, arguments: dict):
            result = await client.call_tool(name, arguments)
            if result.isError:
                raise RuntimeError(result.content[0].text)
            calls[name] += 1
            answer_tokens[name] += len(enc.encode_ordinary(result.content[0].text))
            return result.structuredContent

        for conv in conversations:
            session = conv["sample_id"]
            print(f"{session}: {sum(calls.values())} calls so far", file=sys.stderr, flush=True)
            for turns in sessions(conv, "turns"):
                memories = [memory for _, memory in turns]
                try:
                    await call("recall_memories", {"query": memories[0]["content"], "session_id": session})
                except RuntimeError as err:
                    if not str(err).startswith("session_not_found"):  # the first session of a conversation
                        raise
                    calls["recall_memories"] += 1
                saved = await call("save_memories", {"session_id": session, "memories": memories})
                for dup in saved["near_duplicates"]:
                    near += 1
                    await call("update_memory", {"id": dup["similar_to"], "content": memories[dup["index"]]["content"]})
            for qa in conv["qa"]:
                await call("recall_memories", {"query": qa["question"], "session_id": session})
    return calls, answer_tokens, near


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--conversations", type=int, default=5, help="the first N of LoCoMo dev's 5")
    args = parser.parse_args()
    conversations = json.loads((SHARED / "datasets" / "locomo" / "locomo-dev.json").read_text())[:args.conversations]
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "config.json").write_text("{}")
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("TINYCONTEXT_")},
               "TINYCONTEXT_CONFIG_PATH": f"{tmp}/config.json", "TINYCONTEXT_MEMORY_DB_PATH": f"{tmp}/m.db",
               "TINYCONTEXT_TOOLS": "all", "TINYCONTEXT_WEB_TOOLS": "false"}
        started = time.perf_counter()
        calls, answers, near = anyio.run(loop, conversations, env)
    total_calls = sum(calls.values())
    print(f"{total_calls} tool calls over {len(conversations)} conversations in {time.perf_counter() - started:.0f} s "
          f"(load {os.getloadavg()[0]:.1f}); near-duplicates reported: {near}")
    for name, n in calls.most_common():
        print(f"  {name:18s} {n:5d} calls ({100 * n / total_calls:5.1f}%), answer tokens mean {answers[name] / n:6.1f}")
    separate = tool_schema_tokens(TinyContextConfig(tools="manage"))
    print(f"  manage as six tools: {separate} tokens; as one manage_memories tool with an action: {folded_tokens()} tokens")
    answer_total = sum(answers.values())
    profiles = {}
    for profile in PROFILES:
        schema = tool_schema_tokens(TinyContextConfig(tools=profile))
        profiles[profile] = {"schema_tokens": schema, "per_request": schema + answer_total / total_calls,
                             "run_total": schema * total_calls + answer_total}
        print(f"  profile {profile:18s} schema {schema:5d} per request; mean schema + answer "
              f"{profiles[profile]['per_request']:7.1f}; whole run {profiles[profile]['run_total']:,}")
    if args.out:
        args.out.write_text(json.dumps({"calls": dict(calls), "answer_tokens": dict(answers), "near_duplicates": near,
                                        "manage_separate": separate, "manage_folded": folded_tokens(),
                                        "profiles": profiles, "load": os.getloadavg()}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
