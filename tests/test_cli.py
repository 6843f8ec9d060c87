"""The `tinycontext` command against a temporary database with the real built-in model.

A few runs go through a real subprocess (exit codes, stderr, stdin); the rest call ``main`` in
process, which runs the same code faster.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import HashEmbedder

from tinycontext import MemoryEngine, TinyContextConfig
from tinycontext.cli.commands import main


def tc(env: dict[str, str], *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("TINYCONTEXT_")}
    return subprocess.run([sys.executable, "-m", "tinycontext.cli.commands", *args], input=stdin, capture_output=True, text=True, check=False,
                          env={**base, **env}, timeout=120)


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_subprocess_save_recall_and_errors(env):
    saved = tc(env, "save", "The user prefers pnpm as the JavaScript package manager.", "Deploys go to Fly.io.",
               "--tag", "prefs", "--session", "proj", "--metadata", '{"source": "cli"}', "--json")
    assert saved.returncode == 0, saved.stderr
    result = json.loads(saved.stdout)
    assert result["session_id"] == "proj" and len(result["ids"]) == 2
    pnpm = result["ids"][0]

    jsonl = '{"content": "The billing service uses PostgreSQL 16.", "tags": ["db"]}\n\n"Standups are at 9:30."\n'
    piped = tc(env, "save", "-", "--tag", "team", "--json", stdin=jsonl)
    assert piped.returncode == 0, piped.stderr
    assert len(json.loads(piped.stdout)["ids"]) == 2

    text = tc(env, "recall", "Which package manager does the user like?")
    assert text.returncode == 0, text.stderr
    assert text.stdout.startswith("- The user prefers pnpm as the JavaScript package manager. (")
    first = text.stdout.splitlines()[0]
    assert "tags: prefs;" in first and first.endswith(f"id {pnpm})")

    bad = tc(env, "save", "x", "--metadata", "[1]")
    assert bad.returncode == 1 and bad.stdout == ""
    assert bad.stderr.startswith("invalid_input: --metadata must be a JSON object") and "Traceback" not in bad.stderr


def test_recall_json_and_usage(env, capsys):
    assert run(capsys, "save", "The billing service uses PostgreSQL 16.", "--tag", "db", "--tag", "team")[0] == 0
    assert run(capsys, "save", "PostgreSQL backups run nightly.")[0] == 0
    code, out, _ = run(capsys, "recall", "PostgreSQL", "--tag", "db", "--json")
    recalled = json.loads(out)
    assert code == 0 and [m["content"] for m in recalled["memories"]] == ["The billing service uses PostgreSQL 16."]
    assert recalled["memories"][0]["tags"] == ["db", "team"]
    code, out, _ = run(capsys, "recall", "PostgreSQL", "--top-k", "1")
    assert code == 0 and out.rstrip().endswith("(More: call again with offset=1.)")

    code, out, err = run(capsys, "save", "   ")
    assert (code, out) == (1, "") and err.startswith("empty_memory: ")
    with pytest.raises(SystemExit) as usage:
        main(["recall"])
    assert usage.value.code == 2 and "query" in capsys.readouterr().err


def test_get_update_delete(env, capsys):
    code, out, _ = run(capsys, "save", "Lunch is at noon.", "--tag", "schedule", "--json")
    assert code == 0
    memory_id = json.loads(out)["ids"][0]

    code, out, _ = run(capsys, "update", str(memory_id), "Lunch is at 12:30.", "--tag", "food", "--metadata", '{"by": "test"}', "--json")
    assert code == 0
    updated = json.loads(out)
    assert (updated["content"], updated["tags"], updated["metadata"], updated["version"]) == ("Lunch is at 12:30.", ["food"], {"by": "test"}, 2)

    code, out, _ = run(capsys, "get", str(memory_id))
    assert code == 0 and "Lunch is at 12:30." in out and "v1 until" in out and "Lunch is at noon." in out
    code, out, _ = run(capsys, "update", str(memory_id), "--clear-tags", "--json")
    assert json.loads(out)["tags"] == [] and json.loads(out)["content"] == "Lunch is at 12:30."

    code, out, _ = run(capsys, "delete", str(memory_id))
    assert code == 0 and out.strip() == f"Deleted memory {memory_id}."
    code, out, err = run(capsys, "get", str(memory_id))
    assert code == 1 and out == "" and err.startswith("memory_not_found: ")


def test_sessions_stats_and_input_errors(env, capsys):
    assert run(capsys, "save", "One.", "Two.", "--session", "a")[0] == 0
    code, out, _ = run(capsys, "sessions", "--json")
    assert [(s["session_id"], s["memories"]) for s in json.loads(out)] == [("a", 2)]
    code, out, _ = run(capsys, "stats", "--json")
    stats = json.loads(out)
    assert (stats["memories"], stats["vectors"], stats["sessions"]) == (2, 2, 1)

    for args, expected in [
        (("save", "x", "--metadata", "{oops"), "invalid_input: --metadata is not valid JSON"),
        (("update", "1"), "invalid_input: Nothing to update"),
        (("recall", "x", "--session", "nope"), "session_not_found: "),
        (("recall", "x", "--max-tokens", "0"), "recall_budget: "),
    ]:
        code, out, err = run(capsys, *args)
        assert (code, out) == (1, ""), args
        assert err.startswith(expected), err


def test_save_reads_json_list_from_stdin(env, capsys, monkeypatch):
    import io

    payload = {"memories": [{"content": "From a list.", "tags": ["own"], "metadata": {"k": 1}}, "Bare string."]}
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(payload)))
    code, out, _ = run(capsys, "save", "-", "--tag", "cli", "--metadata", '{"k": 0, "src": "pipe"}', "--json")
    assert code == 0 and len(json.loads(out)["ids"]) == 2
    code, out, _ = run(capsys, "recall", "From a list", "--top-k", "1", "--json", "--detail", "full")
    first = json.loads(out)["memories"][0]
    assert first["tags"] == ["own", "cli"] and first["metadata"] == {"k": 1, "src": "pipe"}

    monkeypatch.setattr(sys, "stdin", io.StringIO('{"content": "ok"}\nnot json\n'))
    code, _, err = run(capsys, "save", "-")
    assert code == 1 and err.startswith("invalid_input: stdin line 2 is not JSON")


def test_reindex_after_model_change(env, capsys, tmp_path):
    """A database built by another embedder is refused until `tinycontext reindex` re-embeds it."""
    config = TinyContextConfig(memory_db_path=tmp_path / "memory.db", models_dir=tmp_path / "models")
    with MemoryEngine(config, embedder=HashEmbedder()) as engine:
        engine.save(["Alpha fact.", "Beta fact.", "Gamma fact."])

    code, _, err = run(capsys, "recall", "alpha")
    assert code == 1 and err.startswith("model_mismatch: ") and "tinycontext reindex" in err
    code, out, _ = run(capsys, "reindex", "--json")
    assert code == 0 and json.loads(out)["reindexed"] == 3 and json.loads(out)["embedder"]["model"] != "hash-test"
    code, out, _ = run(capsys, "recall", "alpha", "--json")
    assert code == 0 and json.loads(out)["memories"][0]["content"] == "Alpha fact."
    code, out, _ = run(capsys, "reindex")
    assert code == 0 and "nothing to re-embed" in out


def test_config_option(env, capsys, tmp_path, monkeypatch):
    monkeypatch.delenv("TINYCONTEXT_MEMORY_DB_PATH")
    (tmp_path / "other.json").write_text(json.dumps({"memory_db_path": "elsewhere/db.sqlite"}))
    code, _, err = run(capsys, "--config", str(tmp_path / "other.json"), "save", "Configured.")
    assert code == 0, err
    assert (tmp_path / "elsewhere" / "db.sqlite").is_file()
    code, _, err = run(capsys, "--config", str(tmp_path / "missing.json"), "stats")
    assert code == 1 and err.startswith("config_error: ")

