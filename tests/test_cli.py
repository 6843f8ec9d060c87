"""The `tinycontext` command against a temporary database with the real built-in model.

A few runs go through a real subprocess (exit codes, stderr, stdin); the rest call ``main`` in
process, which runs the same code faster.
"""

from __future__ import annotations

import io
import json
import os
import shutil
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



# -- issue 19: every failure one line with the fix; settings named; counts in the right number ------

def one_line_error(done: subprocess.CompletedProcess, code: str) -> str:
    """The command failed with exactly one stderr line `code: message` (after any warnings), no traceback."""
    lines = [line for line in done.stderr.splitlines() if not line.startswith("warning: ")]
    assert done.returncode == 1 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith(f"{code}: "), done.stderr
    return lines[0]


def read_only(folder) -> list[str]:
    """A command prefix under which ``folder`` cannot be written. Root ignores file modes, so as root
    the folder is bind-mounted read-only in a private mount namespace (unshare -m), as a read-only
    volume would be; otherwise its mode is 0o555."""
    folder.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        folder.chmod(0o555)
        return []
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True, check=False) if shutil.which("unshare") else None
    if probe is None or probe.returncode != 0:
        pytest.skip("running as root without unshare -m: no way to make a folder read-only for root here")
    return ["unshare", "-m", "sh", "-c", f'mount --bind "{folder}" "{folder}" && mount -o remount,bind,ro "{folder}" && exec "$@"', "ro"]


def test_paths_and_permissions_fail_in_one_line(env, tmp_path):
    (tmp_path / "afile").write_text("not a folder")
    fix = "Point memory_db_path (TINYCONTEXT_MEMORY_DB_PATH) at"
    line = one_line_error(tc({**env, "TINYCONTEXT_MEMORY_DB_PATH": str(tmp_path / "afile" / "data" / "memory.db")}, "stats"), "storage_error")
    assert f"{tmp_path / 'afile'} is a file, not a folder. {fix} a file inside a folder." in line
    assert tc(env, "save", "Something worth keeping.").returncode == 0
    line = one_line_error(tc(env, "export", "--output", str(tmp_path / "afile" / "e.jsonl")), "storage_error")
    assert "is a file, not a folder. Give --output a file inside a folder." in line
    line = one_line_error(tc(env, "backup", str(tmp_path / "afile" / "b.db")), "storage_error")
    assert "is a file, not a folder" in line

    locked = tmp_path / "locked"
    prefix = read_only(locked)

    def in_locked(extra_env, *args):
        base = {k: v for k, v in os.environ.items() if not k.startswith("TINYCONTEXT_")}
        return subprocess.run([*prefix, sys.executable, "-m", "tinycontext.cli.commands", *args], capture_output=True, text=True, check=False,
                              env={**base, **env, **extra_env}, timeout=120)

    line = one_line_error(in_locked({"TINYCONTEXT_MEMORY_DB_PATH": str(locked / "memory.db")}, "stats"), "storage_error")
    assert f"Its folder {locked} is not writable" in line and "point memory_db_path (TINYCONTEXT_MEMORY_DB_PATH) at a writable place" in line
    line = one_line_error(in_locked({"TINYCONTEXT_MEMORY_DB_PATH": str(locked / "sub" / "memory.db")}, "stats"), "storage_error")
    assert f"Cannot create the folder {locked / 'sub'}" in line and "a writable place" in line
    line = one_line_error(in_locked({}, "export", "--output", str(locked / "e.jsonl")), "storage_error")
    assert f"Cannot write --output {locked / 'e.jsonl'}" in line and "folder you can write to" in line
    line = one_line_error(in_locked({}, "backup", str(locked / "b.db")), "storage_error")
    assert f"Check that {locked} is writable" in line
    assert list(locked.iterdir()) == []  # no partial files left behind


def test_an_existing_database_on_a_read_only_folder_says_the_folder_is_not_writable(env, tmp_path):
    kept = tmp_path / "kept"
    db = kept / "memory.db"
    assert tc({**env, "TINYCONTEXT_MEMORY_DB_PATH": str(db)}, "save", "Something worth keeping.").returncode == 0
    before = {p.name: p.read_bytes() for p in kept.iterdir()}
    prefix = read_only(kept)
    base = {k: v for k, v in os.environ.items() if not k.startswith("TINYCONTEXT_")}
    run = subprocess.run([*prefix, sys.executable, "-m", "tinycontext.cli.commands", "stats"], capture_output=True, text=True, check=False,
                         env={**base, **env, "TINYCONTEXT_MEMORY_DB_PATH": str(db)}, timeout=120)
    line = one_line_error(run, "storage_error")
    assert "Its folder is not writable (a read-only volume or mount?)" in line and "damaged" not in line
    assert {p.name: p.read_bytes() for p in kept.iterdir()} == before


@pytest.mark.parametrize("variable, value, expected", [
    ("TINYCONTEXT_FTS_TOKENIZER", "stem", "TINYCONTEXT_FTS_TOKENIZER='stem' is not allowed (Input should be 'porter', 'unicode61' or "
                                          "'trigram'); fts_tokenizer takes one of porter, unicode61, trigram."),
    ("TINYCONTEXT_RECALL_TOP_K", "0", "TINYCONTEXT_RECALL_TOP_K='0' is not allowed (Input should be greater than or equal to 1); "
                                      "recall_top_k takes an integer from 1 to 1000."),
    ("TINYCONTEXT_KEYWORD_FALLBACK", "maybe", "keyword_fallback takes true or false."),
    ("TINYCONTEXT_RECALL_RRF_K", "-1", "recall_rrf_k takes a number above 0."),
    ("TINYCONTEXT_EMBEDDING_DIMENSIONS", "lots", "embedding_dimensions takes an integer from 1 to 65536 (or unset)."),
])
def test_a_bad_setting_is_one_line_naming_it_and_what_it_takes(env, capsys, monkeypatch, variable, value, expected):
    monkeypatch.setenv(variable, value)
    code, out, err = run(capsys, "stats")
    assert (code, out) == (1, "") and err.count("\n") == 1 and err.startswith("config_error: Invalid configuration: ")
    assert expected in err


def test_a_bad_key_in_the_config_file_suggests_the_real_one(env, capsys):
    with open(env["TINYCONTEXT_CONFIG_PATH"], "w") as fh:
        json.dump({"recal_top_k": 3}, fh)
    code, _, err = run(capsys, "stats")
    assert code == 1 and err.count("\n") == 1 and "unknown setting 'recal_top_k'; did you mean 'recall_top_k'?" in err


def test_unknown_variables_are_warned_about_with_the_closest_name(env):
    done = tc({**env, "TINYCONTEXT_EMBEDING_MODEL": "balanced", "TINYCONTEXT_XYZZY": "1"}, "stats")
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [
        "warning: TINYCONTEXT_EMBEDING_MODEL is not a TinyContext setting and is ignored; did you mean TINYCONTEXT_EMBEDDING_MODEL?",
        "warning: TINYCONTEXT_XYZZY is not a TinyContext setting and is ignored; see README.md, section Configuration, for the settings."]
    assert tc({**env, "TINYCONTEXT_API_TOKEN": "x" * 32, "TINYCONTEXT_SQLITE_DRIVER": ""}, "stats").stderr == ""  # read elsewhere


def test_counts_are_in_the_right_number(env, capsys):
    code, out, _ = run(capsys, "save", "Hi")
    assert code == 0 and out.strip() == "Saved 1 memory in session default: id 1 (1 token)"
    assert run(capsys, "sessions")[1].split("\t")[1:3] == ["1 memory", "1 token"]
    assert run(capsys, "list")[1].startswith("1 memory; showing 1 from offset 0")
    assert run(capsys, "forget", "--session", "default")[1].strip() == \
        "1 memory matches; nothing deleted. Run again with --confirm 1 to delete it."
    assert run(capsys, "forget", "--session", "default", "--confirm", "1")[1].strip() == "Deleted 1 memory."


def test_hundreds_of_notes_are_summarised(env, capsys, monkeypatch):
    """400 near-duplicates of a saved memory: five note lines and a count, ids as a range. The
    embedder is the hash stand-in (bag of words: one extra word in 34 keeps the cosine above 0.95)."""
    import tinycontext.models.backends

    monkeypatch.setattr(tinycontext.models.backends, "open_embedder", lambda config: (HashEmbedder(), None))
    text = "the deploy key for the billing service rotates every ninety days and the new key goes into the vault " \
           "before anyone on the platform team may use it in production anywhere at all"
    assert run(capsys, "save", text)[0] == 0
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n".join(json.dumps(f"{text} n{i}") for i in range(400))))
    code, out, _ = run(capsys, "save", "-")
    lines = out.splitlines()
    assert code == 0 and lines[0].startswith("Saved 400 memories in session default: ids 2-401 (")
    assert [line.split(" is similar to id ")[0] for line in lines[1:6]] == [f"  note: #{i}" for i in range(1, 6)]
    assert lines[6:] == ["  ... and 395 more near-duplicate notes (--json lists them all)"]
