"""Dataset loaders. Every loader returns an :class:`EvalDataset`: documents (each becomes one
memory), queries, graded qrels and, for conversational data, the session each query searches.

Every dataset declares a tuning split (configs are chosen on it) and a test split (the chosen
config is reported on it): SciFact tunes on train and reports on test. LoCoMo ships only the dev
conversations: it tunes on them and estimates the test score by cross-validation over
conversations (``cross_validate="session"``).

Loaders are named by ``_target_`` in ``conf/dataset/*.yaml`` and built with ``hydra.utils.instantiate``.
"""

from __future__ import annotations

import contextlib
import csv
import gzip
import hashlib
import json
import os
import re
import sys
from dataclasses import dataclass, field
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Literal

from tinycontext import ConfigError, MissingExtraError

from .fingerprint import sha256_files

NaiveDump = Literal["top10", "session"]
BEIR_SESSION = "corpus"
_DIA_ID = re.compile(r"D\d+:\d+")


@dataclass
class Doc:
    id: str
    text: str
    session: str
    # Conversation turns: what a caller states besides the text (speaker, occurred_at, attachments),
    # and the save call the doc belongs to (a chat session); docs of one batch are saved together.
    fields: dict = field(default_factory=dict)
    batch: str = ""


@dataclass
class EvalDataset:
    name: str
    docs: list[Doc]
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]
    # The session each query recalls from; None means all sessions (one shared corpus).
    query_sessions: dict[str, str] | None = None
    # The fixed baseline an agent without TinyContext would paste, the same for every config: the
    # top 10 documents of a BM25 search, in full (BEIR), or the whole conversation (LoCoMo).
    naive_dump: NaiveDump = "top10"
    fingerprint: str = ""
    info: dict = field(default_factory=dict)
    # Split name -> query ids; configs are chosen on tune_split and reported on test_split.
    splits: dict[str, list[str]] = field(default_factory=dict)
    tune_split: str = "test"
    test_split: str = "test"
    # "session": the test score of a choice is estimated by leave-one-session-out cross-validation.
    cross_validate: str | None = None
    # Per-query facts kept in per_query.csv (e.g. LoCoMo's question category).
    query_info: dict[str, dict] = field(default_factory=dict)

    @property
    def judged(self) -> list[str]:
        """Queries with at least one relevant document, in a stable order."""
        return [q for q in self.queries if any(r > 0 for r in self.qrels.get(q, {}).values())]

    def split_ids(self, split: str) -> list[str]:
        judged = set(self.judged)
        return [q for q in self.splits.get(split, self.judged) if q in judged]


def _read_jsonl(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _read_json(file: Path, what: str, hint: str):
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"Cannot read {what} file {file} ({exc}). Pass dataset.path=<{hint}>.", path=str(file)) from exc


def _first_file(folder: Path, *names: str) -> Path:
    """The first of ``names`` that exists in ``folder`` (BEIR archives ship .jsonl, some mirrors .jsonl.gz)."""
    return next((folder / n for n in names if (folder / n).is_file()), folder / names[0])


def _doc_text(title: str | None, text: str | None) -> str:
    # BEIR convention: title then body; the engine indexes and budgets this whole string.
    return "\n".join(part.strip() for part in (title, text) if part and part.strip())


def _beir_from_records(name: str, corpus: list[dict], queries: list[dict], qrels_by_split: dict[str, list],
                       fingerprint: str, tune_split: str, test_split: str) -> EvalDataset:
    qrels: dict[str, dict[str, int]] = {}
    splits: dict[str, list[str]] = {}
    for split, rows in qrels_by_split.items():
        for qid, did, score in rows:
            qrels.setdefault(str(qid), {})[str(did)] = int(score)
        splits[split] = list(dict.fromkeys(str(r[0]) for r in rows))
    docs = [Doc(str(d["_id"]), _doc_text(d.get("title"), d.get("text")), BEIR_SESSION) for d in corpus]
    docs = [d for d in docs if d.text]
    return EvalDataset(
        name=name, docs=docs, queries={str(q["_id"]): q["text"] for q in queries}, qrels=qrels,
        fingerprint=fingerprint, info={"format": "beir", "tune_split": tune_split, "test_split": test_split},
        splits=splits, tune_split=tune_split, test_split=test_split,
    )


def _read_qrels(file: Path) -> list[list[str]]:
    with open(file, encoding="utf-8", newline="") as fh:
        rows = [r for r in csv.reader(fh, delimiter="\t") if r]
    if rows and not rows[0][-1].lstrip("-").isdigit():
        rows = rows[1:]  # header line "query-id corpus-id score"
    return [r[:3] for r in rows]


def load_beir(path: str | Path, tune_split: str = "train", test_split: str = "test", name: str | None = None) -> EvalDataset:
    """A BEIR folder: ``corpus.jsonl`` (or ``.jsonl.gz``), ``queries.jsonl``, ``qrels/<split>.tsv``
    (header line) for the tuning and the test split. ``tune_split=auto``: ``train`` if the set has it,
    else ``dev`` (NFCorpus, FiQA, Quora, MS MARCO...); a set with a test split only (ArguAna, SciDocs,
    TREC-COVID) has nothing else to tune on."""
    folder = Path(path).expanduser()
    if tune_split == "auto":
        found = [s for s in ("train", "dev") if (folder / "qrels" / f"{s}.tsv").is_file()]
        if not found:
            raise ConfigError(f"{folder} has no train or dev qrels to tune on (only {test_split}). Pass "
                              f"dataset.tune_split={test_split} allow_test_tuning=true to tune on the test split anyway "
                              "(every output is then labelled tuned-on-test).", path=str(folder))
        tune_split = found[0]
    qrels_files = {s: folder / "qrels" / f"{s}.tsv" for s in dict.fromkeys([tune_split, test_split])}
    files = [_first_file(folder, "corpus.jsonl", "corpus.jsonl.gz"), _first_file(folder, "queries.jsonl", "queries.jsonl.gz"),
             *qrels_files.values()]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise ConfigError(
            f"{folder} is not a BEIR dataset folder: missing {', '.join(missing)}. Pass dataset.path=<folder with "
            "corpus.jsonl, queries.jsonl, qrels/<split>.tsv>, dataset.tune_split=<split to choose on> and "
            "dataset.test_split=<split to report on>.", path=str(folder))
    return _beir_from_records(
        name or folder.name, _read_jsonl(files[0]), _read_jsonl(files[1]),
        {s: _read_qrels(f) for s, f in qrels_files.items()}, sha256_files(*files), tune_split, test_split,
    )


def load_tiny(tune_split: str = "train", test_split: str = "test", name: str = "tiny") -> EvalDataset:
    """The small BEIR-format dataset shipped with the harness (quick start, tests)."""
    return load_beir(Path(str(resources.files("evals") / "data" / "tiny")), tune_split=tune_split,
                     test_split=test_split, name=name)


def load_hf_beir(repo: str, qrels_repo: str, tune_split: str = "train", test_split: str = "test",
                 name: str | None = None, cache_dir: str | None = None) -> EvalDataset:
    """A BEIR dataset from the Hugging Face hub (e.g. BeIR/scifact + BeIR/scifact-qrels), cached by ``datasets``."""
    try:
        import datasets
    except ImportError as exc:
        raise MissingExtraError(
            "Loading from the Hugging Face hub needs `datasets`: pip install 'tinycontext[eval]'. Or pass a local "
            "BEIR folder instead: dataset=beir dataset.path=<folder>.") from exc
    try:
        corpus = datasets.load_dataset(repo, "corpus", split="corpus", cache_dir=cache_dir)
        queries = datasets.load_dataset(repo, "queries", split="queries", cache_dir=cache_dir)
        qrels = {s: datasets.load_dataset(qrels_repo, split=s, cache_dir=cache_dir) for s in dict.fromkeys([tune_split, test_split])}
    except Exception as exc:  # offline, unknown repo, hub error: the remedy is the same
        raise ConfigError(
            f"Cannot load {repo} / {qrels_repo} from the Hugging Face hub ({type(exc).__name__}: {exc}). Offline? "
            "Pass a local BEIR folder instead: dataset=beir dataset.path=<folder with corpus.jsonl, queries.jsonl, "
            "qrels/<split>.tsv> (SciFact ships at ../shared/datasets/scifact: dataset=scifact).", repo=repo) from exc
    fingerprint = hashlib.sha256("|".join(d._fingerprint for d in (corpus, queries, *qrels.values())).encode()).hexdigest()
    rows = {s: [(r["query-id"], r["corpus-id"], r["score"]) for r in q] for s, q in qrels.items()}
    return _beir_from_records(name or repo.split("/")[-1], list(corpus), list(queries), rows, fingerprint, tune_split, test_split)


def _ir_datasets_module(home: str | None):
    """ir_datasets, reading its cache from ``home``. ir_datasets fixes its dataset paths when it is first
    imported (from ``IR_DATASETS_HOME``), so ``home`` is set before that or must equal what it was."""
    if home is not None and "ir_datasets" not in sys.modules:
        os.environ["IR_DATASETS_HOME"] = home
    try:
        import ir_datasets
    except ImportError as exc:
        raise MissingExtraError("Loading an ir_datasets dataset needs `ir_datasets`: pip install 'tinycontext[eval]'. "
                                "Or pass a local BEIR folder instead: dataset=beir dataset.path=<folder>.") from exc
    current = Path(os.environ.get("IR_DATASETS_HOME", Path.home() / ".ir_datasets")).expanduser().resolve()
    if home is not None and current != Path(home):
        raise ConfigError(f"ir_datasets was already imported in this process with IR_DATASETS_HOME={current}, not {home}: "
                          "set IR_DATASETS_HOME before the process starts instead of dataset.path.", path=home)
    return ir_datasets, current


def _download_entry(ir_datasets, url: str) -> tuple[str, dict] | None:
    """Where ir_datasets' download list says the file for ``url`` lives: (its top-level group, the entry)."""
    def walk(node):
        if isinstance(node, dict):
            if node.get("url") == url:
                yield node
            for value in node.values():
                yield from walk(value)
    for group, entries in ir_datasets.util.DownloadConfig.contents().items():
        for entry in walk(entries):
            return group, entry
    return None


@contextlib.contextmanager
def _local_files_only(ir_datasets, home: Path):
    """Every download ir_datasets would start is refused before it sends anything; the error names the
    file it wanted and where to put it (ir_datasets' cache path, or the downloads folder it checks first)."""
    from ir_datasets.util import download

    refused: list[str] = []

    def refuse(self):
        refused.append(str(getattr(self, "url", None) or getattr(self, "uri", self)))
        raise ConnectionRefusedError("dataset.download=false")

    remote = (download.RequestsDownload, download.GoogleDriveDownload, download.GoogleCloudBucketStream)
    saved = {cls: cls.__dict__["stream"] for cls in remote}
    for cls in remote:
        cls.stream = refuse
    try:
        yield
    except Exception as exc:
        if not refused:
            raise
        places = []
        for url in dict.fromkeys(refused):
            found = _download_entry(ir_datasets, url)
            where = [str(home / found[0] / found[1]["cache_path"])] if found and "cache_path" in found[1] else []
            if found and found[1].get("expected_md5"):
                where.append(str(home / "downloads" / found[1]["expected_md5"]))
            places.append(f"{url} (put it at {' or '.join(where) or 'the path ir_datasets documents'})")
        raise ConfigError(f"ir_datasets needs files that are not in its cache {home}: {'; '.join(places)}. Copy them there, "
                          "or pass dataset.download=true where the internet is reachable.", path=str(home)) from exc
    finally:
        for cls, stream in saved.items():
            cls.stream = stream


def load_ir_datasets(dataset_id: str, tune_split: str = "auto", test_split: str = "test", name: str | None = None,
                     path: str | Path | None = None, download: bool = False) -> EvalDataset:
    """A dataset ir_datasets knows (``beir/scifact``, ``beir/nfcorpus``, ``antique``...), read through ir_datasets
    from its cache folder ``path`` (its ``IR_DATASETS_HOME``; default: that variable, else ~/.ir_datasets).

    Each split is the subset ``<dataset_id>/<split>`` (``beir/scifact/train``), else ``split`` taken as a
    dataset id of its own (``msmarco-passage/dev/small``), else, for the test split, ``dataset_id`` itself when
    it has qrels (``beir/arguana``). ``tune_split=auto``: ``train`` if the dataset has that subset, else ``dev``.
    Documents come from ``dataset_id``; texts as in :func:`load_beir` (title, then body).

    ``download=false`` (the default) reads only files already in the cache: a missing one is an error naming
    where to put it, and nothing is requested from the network. ``download=true`` lets ir_datasets fetch what
    is missing, as it does by itself."""
    home = None if path is None else str(Path(path).expanduser().resolve())
    irds, current = _ir_datasets_module(home)

    def subset(split: str):
        for candidate in (f"{dataset_id}/{split}", split):
            if candidate in irds.registry:
                return irds.load(candidate)
        if split == test_split and dataset_id in irds.registry and irds.load(dataset_id).has_qrels():
            return irds.load(dataset_id)
        return None

    if dataset_id not in irds.registry:
        raise ConfigError(f"ir_datasets does not know {dataset_id!r} (ir_datasets {irds.__version__}). Pass "
                          "dataset.dataset_id=<an id from https://ir-datasets.com, e.g. beir/scifact>.", dataset_id=dataset_id)
    if tune_split == "auto":
        tune_split = next((s for s in ("train", "dev") if f"{dataset_id}/{s}" in irds.registry), "")
        if not tune_split:
            raise ConfigError(f"{dataset_id} has no train or dev subset to tune on. Pass dataset.tune_split={test_split} "
                              "allow_test_tuning=true to tune on the test split anyway (every output is then labelled "
                              "tuned-on-test).", dataset_id=dataset_id)
    parts = {s: subset(s) for s in dict.fromkeys([tune_split, test_split])}
    missing = [s for s, d in parts.items() if d is None or not d.has_qrels()]
    if missing:
        raise ConfigError(f"{dataset_id} has no split {', '.join(missing)} with qrels. Pass dataset.tune_split= and "
                          f"dataset.test_split= (subsets of {dataset_id}, or ir_datasets ids).", dataset_id=dataset_id)
    guard = contextlib.nullcontext() if download else _local_files_only(irds, current)
    with guard:
        corpus = [{"_id": d.doc_id, "title": getattr(d, "title", None), "text": d.text if hasattr(d, "text") else d.default_text()}
                  for d in irds.load(dataset_id).docs_iter()]
        queries = {q.query_id: getattr(q, "text", None) or q.default_text() for d in parts.values() for q in d.queries_iter()}
        qrels = {s: [(r.query_id, r.doc_id, r.relevance) for r in d.qrels_iter()] for s, d in parts.items()}
    digest = hashlib.sha256(json.dumps([corpus, queries, qrels], sort_keys=True).encode()).hexdigest()
    dataset = _beir_from_records(name or dataset_id.replace("/", "-"), corpus, [{"_id": k, "text": v} for k, v in queries.items()],
                                 qrels, digest, tune_split, test_split)
    dataset.info |= {"format": "ir_datasets", "dataset_id": dataset_id}
    return dataset


def locomo_turn_text(turn: dict) -> str:
    text = f"{turn['speaker']}: {turn.get('text', '').strip()}"
    if turn.get("blip_caption"):
        text += f" [shares a photo: {turn['blip_caption']}]"
    return text


def locomo_turn(turn: dict, date_time: str) -> dict:
    """A turn as the engine's conversation API takes it (README, "Saving a conversation")."""
    fields = {"speaker": turn["speaker"]}
    for pattern in ("%I:%M %p on %d %B, %Y", "%d %B, %Y", "%d %B %Y"):  # LoCoMo writes "1:56 pm on 8 May, 2023"
        try:
            fields["occurred_at"] = datetime.strptime(" ".join(date_time.split()), pattern).isoformat(timespec="minutes")
            break
        except ValueError:
            continue
    if turn.get("blip_caption"):
        fields["attachments"] = [turn["blip_caption"]]
    return fields


_QUESTION = re.compile(r"[^.!?]*\?")
# second person -> the speaker asked, first person -> the one asking ("we" stays: both)
_PERSON = [(re.compile(rf"\b{word}\b", 0 if word.startswith("I") else re.IGNORECASE), who, rest) for word, who, rest in (
    ("you're", "b", " is"), ("you've", "b", " has"), ("you'll", "b", " will"), ("you'd", "b", " would"), ("yourself", "b", ""),
    ("yours", "b", "'s"), ("your", "b", "'s"), ("you", "b", ""), ("u", "b", ""), ("I'm", "a", " is"), ("I've", "a", " has"),
    ("I'll", "a", " will"), ("I'd", "a", " would"), ("myself", "a", ""), ("my", "a", "'s"), ("me", "a", ""), ("I", "a", ""))]


def dialog_question(text: str, asker: str, asked: str, min_words: int = 5) -> str:
    """The questions in a chat turn of ``asker`` to ``asked`` as a memory question would put them ("What got you into
    books?" -> "What got Tim into books?"), or "" when none has ``min_words`` words ("How are you?" asks nothing)."""
    questions = [q.strip() for q in _QUESTION.findall(text) if len(re.findall(r"[A-Za-z']+", q)) >= min_words]
    out = " ".join(questions)
    for pattern, who, rest in _PERSON:
        out = pattern.sub((asked if who == "b" else asker) + rest, out)
    return out


def load_locomo(path: str | Path, categories: list[int] = (1, 2, 3, 4), name: str = "locomo",
                memory_format: Literal["turns", "text"] = "turns",
                queries_from: Literal["qa", "observations", "dialog"] = "qa") -> EvalDataset:
    """LoCoMo: each dialogue turn is a memory, one session per conversation, evidence turns are the qrels.

    Categories 1-4 are answerable from evidence turns; category 5 is adversarial (questions about
    things that never happened: no answer exists) and is left out by default. The shipped
    conversations are the dev split: configs are tuned on them, and the test score of a choice is
    estimated by leave-one-conversation-out cross-validation.

    ``memory_format``: ``turns`` saves each chat session in one call, a turn per memory with its
    speaker, time and image caption (the README's recipe); ``text`` saves "Speaker: text [shares a
    photo: caption]" strings, the whole conversation in one call.

    ``queries_from``: ``observations`` takes the queries from the dataset's observations instead of its
    questions (facts its authors drew from each chat session, each naming the turns it comes from: statements,
    not questions; training data, e.g. ``scripts/finetune_minilm.py``), ``categories`` then unused. ``dialog``
    takes them from the chat itself: a turn's questions of five words or more, asked in the third person
    (``dialog_question``), each answered by the next turn when the other speaker says it; its qrels that turn,
    its ``query_info`` the turn that asked (``asked_in``: the same words, but not the answer).
    """
    if memory_format not in ("turns", "text"):
        raise ConfigError(f"dataset.memory_format must be turns or text, got {memory_format!r}.")
    if queries_from not in ("qa", "observations", "dialog"):
        raise ConfigError(f"queries_from must be qa, observations or dialog, got {queries_from!r}.")
    file = Path(path).expanduser()
    samples = _read_json(file, "LoCoMo", "locomo json")
    wanted = {int(c) for c in categories}
    docs: list[Doc] = []
    queries: dict[str, str] = {}
    qrels: dict[str, dict[str, int]] = {}
    sessions: dict[str, str] = {}
    query_info: dict[str, dict] = {}
    for sample in samples:
        conv_id = sample["sample_id"]
        conversation = sample["conversation"]
        numbers = sorted(int(k.split("_")[1]) for k in conversation if re.fullmatch(r"session_\d+", k))
        known: set[str] = set()
        for n in numbers:
            for turn in conversation[f"session_{n}"]:
                known.add(turn["dia_id"])
                if memory_format == "turns":
                    docs.append(Doc(f"{conv_id}:{turn['dia_id']}", turn.get("text", "").strip(), conv_id,
                                    locomo_turn(turn, conversation.get(f"session_{n}_date_time", "")), f"session_{n}"))
                else:
                    docs.append(Doc(f"{conv_id}:{turn['dia_id']}", locomo_turn_text(turn), conv_id))
        if queries_from == "dialog":
            items = [(f"{conv_id}:a{asked['dia_id']}", question, [answer["dia_id"]], {"asked_in": f"{conv_id}:{asked['dia_id']}"})
                     for n in numbers for asked, answer in zip(conversation[f"session_{n}"], conversation[f"session_{n}"][1:])
                     if asked["speaker"] != answer["speaker"]
                     and (question := dialog_question(asked.get("text", ""), asked["speaker"], answer["speaker"]))]
        elif queries_from == "observations":
            # {"session_N_observation": {speaker: [[fact, "D1:3" or ["D1:3", ...]], ...]}}
            items = [(f"{conv_id}:o{key.split('_')[1]}.{speaker}.{i}", fact, [raw] if isinstance(raw, str) else raw, {})
                     for key, by_speaker in sample.get("observation", {}).items()
                     for speaker, facts in by_speaker.items() for i, (fact, raw) in enumerate(facts)]
        else:
            items = [(f"{conv_id}:q{i}", qa["question"], qa.get("evidence", []), {"category": int(qa.get("category", 0))})
                     for i, qa in enumerate(sample["qa"])]
        for qid, text, raws, info in items:
            # Some evidence entries pack several ids ("D8:6; D9:17"); a few name turns that do not exist.
            evidence = [e for raw in raws for e in _DIA_ID.findall(str(raw)) if e in known]
            if (queries_from == "qa" and info["category"] not in wanted) or not evidence:
                continue
            queries[qid] = str(text)
            qrels[qid] = {f"{conv_id}:{e}": 1 for e in evidence}
            sessions[qid] = conv_id
            query_info[qid] = info
    return EvalDataset(
        name=name, docs=docs, queries=queries, qrels=qrels, query_sessions=sessions, naive_dump="session",
        fingerprint=sha256_files(file), info={"format": "locomo", **({"categories": sorted(wanted)} if queries_from == "qa" else
                                                                      {"queries_from": queries_from}), "memory_format": memory_format},
        splits={"dev": list(queries)}, tune_split="dev", test_split="dev", cross_validate="session",
        query_info=query_info,
    )


def _longmemeval_turn(turn: dict) -> str:
    return f"{turn.get('role', 'user')}: {str(turn.get('content', '')).strip()}"


def load_longmemeval(path: str | Path, granularity: Literal["turn", "session"] = "session", name: str = "longmemeval",
                     test_share: float = 0.5) -> EvalDataset:
    """LongMemEval (its public JSON: a list of questions, each with ``haystack_sessions`` (lists of
    ``{role, content, has_answer?}`` turns), ``haystack_session_ids``, ``haystack_dates`` and
    ``answer_session_ids``). Each question searches its own haystack (one engine session per question).

    ``granularity``: ``session`` saves each haystack session as one memory, relevant when it is an
    answer session; ``turn`` saves each turn, relevant when it has ``has_answer`` (questions with no
    such turn are left out). Abstention questions (``question_id`` ending ``_abs``: the answer is not
    in the haystack) have nothing to retrieve and are excluded. LongMemEval has no tuning split: the
    questions are split by a hash of their id into ``dev`` (tuned on) and ``test`` (``test_share``)."""
    if granularity not in ("turn", "session"):
        raise ConfigError(f"dataset.granularity must be turn or session, got {granularity!r}.")
    file = Path(path).expanduser()
    items = _read_json(file, "LongMemEval", "longmemeval json")
    docs: list[Doc] = []
    queries: dict[str, str] = {}
    qrels: dict[str, dict[str, int]] = {}
    sessions: dict[str, str] = {}
    splits: dict[str, list[str]] = {"dev": [], "test": []}
    query_info: dict[str, dict] = {}
    for item in items:
        qid = str(item["question_id"])
        if qid.endswith("_abs"):
            continue
        answers = {str(s) for s in item.get("answer_session_ids", [])}
        relevant: dict[str, int] = {}
        for sid, turns in zip(item["haystack_session_ids"], item["haystack_sessions"]):
            if granularity == "session":
                doc_id = f"{qid}/{sid}"
                docs.append(Doc(doc_id, "\n".join(_longmemeval_turn(t) for t in turns), qid, {}, str(sid)))
                if str(sid) in answers:
                    relevant[doc_id] = 1
            else:
                for i, turn in enumerate(turns):
                    doc_id = f"{qid}/{sid}/{i}"
                    docs.append(Doc(doc_id, _longmemeval_turn(turn), qid, {"speaker": turn.get("role", "user")}, str(sid)))
                    if turn.get("has_answer"):
                        relevant[doc_id] = 1
        if not relevant:
            continue
        queries[qid], qrels[qid], sessions[qid] = str(item["question"]), relevant, qid
        query_info[qid] = {"question_type": str(item.get("question_type", ""))}
        share = int(hashlib.sha256(qid.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
        splits["test" if share < test_share else "dev"].append(qid)
    return EvalDataset(
        name=name, docs=docs, queries=queries, qrels=qrels, query_sessions=sessions, naive_dump="session",
        fingerprint=sha256_files(file), info={"format": "longmemeval", "granularity": granularity, "test_share": test_share},
        splits=splits, tune_split="dev", test_split="test", query_info=query_info,
    )
