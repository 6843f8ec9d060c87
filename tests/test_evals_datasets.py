"""Dataset loaders on small fixtures written here, and on the shipped tiny dataset."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from evals.datasets import dialog_question, load_beir, load_hf_beir, load_locomo, load_tiny
from tinycontext import ConfigError, MissingExtraError


def test_tiny_dataset_is_complete():
    ds = load_tiny()
    assert (len(ds.docs), len(ds.queries), len(ds.judged)) == (30, 18, 18)
    ids = {d.id for d in ds.docs}
    assert all(set(rels) <= ids for rels in ds.qrels.values())
    assert ds.naive_dump == "top10" and ds.query_sessions is None and len(ds.fingerprint) == 64
    # Tuned on train, reported on test: disjoint query sets.
    assert (ds.tune_split, ds.test_split) == ("train", "test")
    assert len(ds.split_ids("train")) == 8 and len(ds.split_ids("test")) == 10
    assert not set(ds.split_ids("train")) & set(ds.split_ids("test"))


def write_beir(folder, header=True):
    (folder / "qrels").mkdir(parents=True)
    (folder / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\n3\ta\t1\n", encoding="utf-8")
    (folder / "corpus.jsonl").write_text(
        json.dumps({"_id": "a", "title": "Title A", "text": "Body A."}) + "\n"
        + json.dumps({"_id": "b", "title": "", "text": "Body B."}) + "\n"
        + json.dumps({"_id": "c", "title": "", "text": "  "}) + "\n", encoding="utf-8")
    (folder / "queries.jsonl").write_text(
        json.dumps({"_id": "1", "text": "first?"}) + "\n" + json.dumps({"_id": "2", "text": "second?"}) + "\n"
        + json.dumps({"_id": "3", "text": "third?"}) + "\n", encoding="utf-8")
    lines = ["query-id\tcorpus-id\tscore"] if header else []
    (folder / "qrels" / "test.tsv").write_text("\n".join([*lines, "1\ta\t2", "1\tb\t0", "2\tb\t1"]) + "\n", encoding="utf-8")


@pytest.mark.parametrize("header", [True, False])
def test_beir_folder(tmp_path, header):
    write_beir(tmp_path / "mini", header)
    ds = load_beir(tmp_path / "mini")
    assert ds.name == "mini"
    assert [(d.id, d.text) for d in ds.docs] == [("a", "Title A\nBody A."), ("b", "Body B.")]  # empty doc dropped
    assert ds.qrels == {"1": {"a": 2, "b": 0}, "2": {"b": 1}, "3": {"a": 1}}
    assert ds.judged == ["1", "2", "3"]
    assert ds.split_ids("test") == ["1", "2"] and ds.split_ids("train") == ["3"]
    same = load_beir(tmp_path / "mini", tune_split="test")  # a dataset without a tuning split says so
    assert same.split_ids(same.tune_split) == same.split_ids(same.test_split) == ["1", "2"]


def test_beir_fingerprint_follows_content(tmp_path):
    write_beir(tmp_path / "x")
    before = load_beir(tmp_path / "x").fingerprint
    with open(tmp_path / "x" / "qrels" / "test.tsv", "a", encoding="utf-8") as fh:
        fh.write("2\ta\t1\n")
    assert load_beir(tmp_path / "x").fingerprint != before


def test_beir_missing_files_say_what_to_pass(tmp_path):
    with pytest.raises(ConfigError, match="dataset.tune_split="):
        load_beir(tmp_path, tune_split="dev")


def test_locomo(tmp_path):
    sample = {
        "sample_id": "conv-1",
        "conversation": {
            "speaker_a": "Ann", "speaker_b": "Ben", "session_1_date_time": "1 May 2023",
            "session_1": [{"speaker": "Ann", "dia_id": "D1:1", "text": "I adopted a dog."},
                          {"speaker": "Ben", "dia_id": "D1:2", "text": "Nice!", "blip_caption": "a puppy"}],
            "session_2_date_time": "2 May 2023",
            "session_2": [{"speaker": "Ann", "dia_id": "D2:1", "text": "The dog is called Rex."}],
        },
        "qa": [
            {"question": "What pet?", "answer": "dog", "evidence": ["D1:1"], "category": 1},
            {"question": "Name?", "answer": "Rex", "evidence": ["D1:1; D2:1", "D9:9"], "category": 4},
            {"question": "Trick?", "answer": "none", "evidence": [], "category": 5},
            {"question": "Adversarial", "answer": "x", "evidence": ["D1:2"], "category": 5},
        ],
        "observation": {"session_1_observation": {"Ann": [["Ann adopted a dog.", "D1:1"], ["Ann has a pet.", ["D1:1", "D2:1"]]],
                                                  "Ben": [["Ben likes puppies.", "D9:9"]]}},
    }
    file = tmp_path / "locomo.json"
    file.write_text(json.dumps([sample]), encoding="utf-8")
    ds = load_locomo(file)
    assert [d.id for d in ds.docs] == ["conv-1:D1:1", "conv-1:D1:2", "conv-1:D2:1"]
    assert {d.session for d in ds.docs} == {"conv-1"}
    # Default: the README's recipe, one save call per chat session, a turn per memory with its facts.
    assert (ds.docs[1].text, ds.docs[1].batch) == ("Nice!", "session_1") and ds.docs[2].batch == "session_2"
    assert ds.docs[1].fields == {"speaker": "Ben", "occurred_at": "2023-05-01T00:00", "attachments": ["a puppy"]}
    text = load_locomo(file, memory_format="text")
    assert text.docs[1].text == "Ben: Nice! [shares a photo: a puppy]" and text.docs[1].fields == {} and text.docs[1].batch == ""
    assert ds.queries == {"conv-1:q0": "What pet?", "conv-1:q1": "Name?"}
    assert ds.qrels["conv-1:q1"] == {"conv-1:D1:1": 1, "conv-1:D2:1": 1}  # packed ids split, unknown D9:9 dropped
    assert ds.query_sessions == {"conv-1:q0": "conv-1", "conv-1:q1": "conv-1"} and ds.naive_dump == "session"
    assert ds.query_info == {"conv-1:q0": {"category": 1}, "conv-1:q1": {"category": 4}}
    # Only dev conversations ship: tuned on them, test estimated by cross-validation over conversations.
    assert ds.tune_split == ds.test_split == "dev" and ds.cross_validate == "session"
    assert set(load_locomo(file, categories=[5]).queries) == {"conv-1:q3"}
    # The dataset's observations as queries (training data): facts naming their turns, unknown turns dropped.
    facts = load_locomo(file, queries_from="observations")
    assert facts.queries == {"conv-1:o1.Ann.0": "Ann adopted a dog.", "conv-1:o1.Ann.1": "Ann has a pet."}
    assert facts.qrels["conv-1:o1.Ann.1"] == {"conv-1:D1:1": 1, "conv-1:D2:1": 1} and facts.docs == ds.docs
    with pytest.raises(ConfigError):
        load_locomo(file, queries_from="answers")


def test_locomo_dialog_questions_are_answered_by_the_next_turn(tmp_path):
    turns = [("Ann", "Hi! How are you?"), ("Ben", "Good. What got you into pottery, and is it your job?"),
             ("Ann", "My aunt taught me. Did you see my vase?"), ("Ann", "What do you think of my new blue vase?"),
             ("Ben", "I love it, I'm jealous!")]
    sample = {"sample_id": "conv-1", "qa": [], "conversation": {
        "speaker_a": "Ann", "speaker_b": "Ben", "session_1_date_time": "1 May 2023",
        "session_1": [{"speaker": who, "dia_id": f"D1:{i}", "text": text} for i, (who, text) in enumerate(turns, 1)]}}
    file = tmp_path / "locomo.json"
    file.write_text(json.dumps([sample]), encoding="utf-8")
    dialog = load_locomo(file, queries_from="dialog")
    # "How are you?" is too short to ask anything; D1:3 is answered by its own speaker's next turn, so by no one
    assert dialog.queries == {"conv-1:aD1:2": "What got Ann into pottery, and is it Ann's job?",
                              "conv-1:aD1:4": "What do Ben think of Ann's new blue vase?"}
    assert dialog.qrels == {"conv-1:aD1:2": {"conv-1:D1:3": 1}, "conv-1:aD1:4": {"conv-1:D1:5": 1}}
    assert dialog.query_info["conv-1:aD1:4"] == {"asked_in": "conv-1:D1:4"} and dialog.query_sessions["conv-1:aD1:2"] == "conv-1"
    # first person is the one asking, second the one asked; only the questions of a turn are kept
    assert dialog_question("I'm lost. Are you sure I've got your keys?", "Ann", "Ben") == "Are Ben sure Ann has got Ben's keys?"
    assert dialog_question("Really?", "Ann", "Ben") == ""


def test_real_locomo_dev_shape(shared_dir):
    ds = load_locomo(shared_dir / "datasets" / "locomo" / "locomo-dev.json")
    assert len({d.session for d in ds.docs}) == 5
    assert len(ds.judged) == len(ds.queries) > 700
    ids = {d.id for d in ds.docs}
    assert all(set(r) <= ids for r in ds.qrels.values())


def test_hub_loader_offline_says_what_to_pass_instead(monkeypatch, tmp_path):
    if importlib.util.find_spec("datasets") is None:
        with pytest.raises(MissingExtraError, match="dataset.path"):
            load_hf_beir("BeIR/scifact", "BeIR/scifact-qrels")
        return
    # huggingface_hub reads HF_HUB_OFFLINE once, at import: setting the env var here would leave the
    # whole test session offline if this were the first import. Patch the read values instead.
    import datasets
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
    with pytest.raises(ConfigError, match="dataset.path"):
        load_hf_beir("BeIR/scifact", "BeIR/scifact-qrels", cache_dir=str(tmp_path))


def ir_datasets_home(home, source):
    """ir_datasets' cache as it leaves it after downloading BEIR SciFact: <home>/beir/scifact/source.zip, the
    BEIR archive (scifact/corpus.jsonl, queries.jsonl, qrels/<split>.tsv). Here it holds the tiny dataset."""
    import zipfile

    (home / "beir" / "scifact").mkdir(parents=True)
    with zipfile.ZipFile(home / "beir" / "scifact" / "source.zip", "w") as zf:
        for file in sorted(p for p in source.rglob("*") if p.is_file() and p.suffix in (".jsonl", ".tsv")):
            zf.write(file, f"scifact/{file.relative_to(source).as_posix()}")


def in_fresh_process(home, code):
    """ir_datasets fixes its dataset paths from IR_DATASETS_HOME at its first import: one process per cache."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "IR_DATASETS_HOME": str(home)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    return done


@pytest.mark.parametrize("source", ["tiny", "scifact"])
def test_ir_datasets_reads_its_own_cache_offline(tmp_path, source, request):
    pytest.importorskip("ir_datasets")
    from importlib import resources

    folder = (Path(str(resources.files("evals") / "data" / "tiny")) if source == "tiny"
              else request.getfixturevalue("shared_dir") / "datasets" / "scifact")
    ir_datasets_home(tmp_path / "irds", folder)
    done = in_fresh_process(tmp_path / "irds", (
        "import json; from evals.datasets import load_ir_datasets\n"
        "ds = load_ir_datasets('beir/scifact')\n"
        "print(json.dumps([ds.name, ds.tune_split, ds.test_split, [(d.id, d.text) for d in ds.docs], ds.queries, ds.qrels,"
        " {s: ds.split_ids(s) for s in ('train', 'test')}, ds.fingerprint]))"))
    assert done.returncode == 0, done.stderr
    name, tune, test, docs, queries, qrels, splits, fingerprint = json.loads(done.stdout.splitlines()[-1])
    want = load_beir(folder)
    # The same records as the BEIR folder loader reads from the same files; queries of the two splits only.
    assert (name, tune, test) == ("beir-scifact", "train", "test")
    assert docs == [[d.id, d.text] for d in want.docs]
    assert queries == {q: want.queries[q] for q in queries} and set(queries) == set(want.qrels)
    assert qrels == want.qrels
    assert splits == {s: want.split_ids(s) for s in ("train", "test")} and all(splits.values())
    assert len(fingerprint) == 64


def test_ir_datasets_missing_file_is_refused_without_a_request(tmp_path):
    pytest.importorskip("ir_datasets")
    (tmp_path / "irds").mkdir()
    done = in_fresh_process(tmp_path / "irds", (
        "from evals.datasets import load_ir_datasets\n"
        "import requests\n"
        "sent = []\n"
        "def record(self, method, url, **kw):\n"
        "    sent.append(url)\n"
        "    raise AssertionError('request sent')\n"
        "requests.Session.request = record\n"
        "try:\n"
        "    load_ir_datasets('beir/scifact')\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__, exc, 'sent', len(sent))\n"))
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()[-1]
    assert out.startswith("ConfigError") and out.endswith("sent 0")
    # It names the file ir_datasets wanted and where to put it, and how to let it download.
    assert "scifact.zip" in out and str(tmp_path / "irds" / "beir" / "scifact" / "source.zip") in out
    assert "dataset.download=true" in out


def test_ir_datasets_unknown_id_and_split_say_what_to_pass(tmp_path):
    pytest.importorskip("ir_datasets")
    done = in_fresh_process(tmp_path, (
        "from evals.datasets import load_ir_datasets\n"
        "for args in (('nope/nothing',), ('beir/arguana',), ('beir/scifact', 'train', 'dev')):\n"
        "    try:\n"
        "        load_ir_datasets(*args)\n"
        "    except Exception as exc:\n"
        "        print(type(exc).__name__, exc)\n"))
    assert done.returncode == 0, done.stderr
    unknown, no_tune, no_split = done.stdout.splitlines()[-3:]
    assert unknown.startswith("ConfigError") and "dataset.dataset_id=" in unknown
    assert no_tune.startswith("ConfigError") and "allow_test_tuning=true" in no_tune
    assert no_split.startswith("ConfigError") and "dataset.test_split=" in no_split
