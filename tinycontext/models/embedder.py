"""Text embeddings on the CPU: ONNX transformer bundles and static (model2vec) bundles.

A bundle is a folder with ``model.onnx`` (or model2vec's ``model.safetensors``), ``tokenizer.json``
and ``model_config.json``. The shipped ``tokenizer.json`` files often pad every input to a fixed
length; we turn that off and pad each length-sorted batch to its own longest input, which is where
most CPU time goes otherwise.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Sequence

import numpy as np
from tqdm.auto import tqdm

from .. import telemetry
from ..errors import ModelUnavailableError
from .identity import DOCUMENT_GRAPH, same_embedder
from .checksum import file_sha256
from .int8_graph import REWRITE_VERSION, int8_compute_graph
from .vector_cache import VectorCache

Kind = Literal["query", "document"]
POOLINGS = ("mean", "cls", "graph", "static")
# Padded tokens per ONNX batch. Small batches run faster on CPU (cache-sized matrices, less padding;
# notes/design_figures.md); long documents are unaffected.
MAX_BATCH_TOKENS = 512
# ONNX graph rewrites left out: on this CPU kernel the fused SkipLayerNormalization runs slower than
# the Add + LayerNormalization it replaces (scripts/bench_embed.py, notes/bench_embed.md).
DISABLED_OPTIMIZERS = ["SkipLayerNormFusion"]
# The version of how this file turns a text into a vector: tokenizer settings, padding and masking,
# pooling, normalisation, ONNX session options. Bump it with any change to those; caches of vectors
# (evals.embedding_cache) key on it rather than on this file's text, so other edits keep them.
# tests/test_evals_metrics.py pins the real model's vectors to it.
VECTOR_RECIPE = 1
# The int8-compute graph's name: recorded in a database's embedder identity under DOCUMENT_GRAPH when
# its vectors were made on it (absent: the model's own float32 graph, as in every older database).
INT8_GRAPH = f"int8-token-rows-{REWRITE_VERSION}"
# The queries' int8 graph: one activation scale per text (int8_compute_graph's per_text), each text run alone.
QUERY_GRAPH = f"int8-text-{REWRITE_VERSION}"
# A bundle's calibrated outlier channels for the int8 graphs (scripts/calibrate_int8_outliers.py).
OUTLIERS_FILE = "int8_outliers.json"


def _digest(channels: dict[str, list[int]]) -> str:
    return hashlib.sha256(json.dumps(channels, sort_keys=True).encode()).hexdigest()[:12]


def outlier_graph_name(channels: dict[str, list[int]]) -> str:
    """The outlier graph's name: the rewrite's version and a digest of the channels, so a recalibrated
    model's vectors are not taken for the older calibration's."""
    return f"int8-outliers-{REWRITE_VERSION}-{_digest(channels)}"


def query_graph_name(channels: dict[str, list[int]] | None) -> str:
    """The query graph's name: QUERY_GRAPH, with the channels' digest when it keeps calibrated outliers."""
    return f"{QUERY_GRAPH}-{_digest(channels)}" if channels else QUERY_GRAPH


# What a bundle's config may state that recall reads besides its vectors (ModelBundle's fields of these names): an
# Embedder carries them as attributes, and so does anything that wraps one (evals' cache).
STATED = ("min_dense", "fusion_weights", "turn_score_cliff", "turn_score_gap")


def _positive(value, name: str) -> float:
    number = float(value)
    if not 0.0 < number < float("inf"):  # NaN fails too
        raise ValueError(f"{name} must be a positive number, not {value!r}")
    return number


def cpu_count() -> int:
    """CPUs this process may run on (the affinity mask, not the machine's total)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


@dataclass(frozen=True)
class ModelBundle:
    """A resolved, verified model on disk."""

    name: str
    revision: str
    path: Path
    model_file: Path
    tokenizer_file: Path
    dimensions: int
    max_tokens: int
    pooling: str
    normalize: bool = True
    query_prefix: str = ""
    document_prefix: str = ""
    sha256: str = ""
    extra: dict = field(default_factory=dict)
    # The relevance floor (dense cosine) this model's scores call for, when its config states one.
    min_dense: float | None = None
    # The learned fusion's weights fitted on this model's signals (retrieval/conversation.py FUSION_FEATURES),
    # when its config states them: a model spreads its cosines its own way, so the dense features' weights differ.
    fusion_weights: tuple[float, ...] | None = None
    # The score cliff (recall_score_cliff) for answers of conversation turns that this model's scores call for, when
    # its config states one: a model that pulls unrelated turns further down ends those answers earlier at one cliff.
    turn_score_cliff: float | None = None
    # Where an answer of turns ranked by the learned fusion ends, when its config states it: after the last turn whose
    # learned score is within this of the best (memory/recall.py stop); in place of the cliff for those answers.
    turn_score_gap: float | None = None

    @property
    def stated(self) -> dict:
        """What this model's config states that recall reads besides its vectors (the fields above)."""
        return {name: getattr(self, name) for name in STATED}

    @classmethod
    def from_folder(cls, path: Path, *, name: str | None = None, revision: str = "", sha256: str = "", model_file: Path | None = None,
                    tokenizer_file: Path | None = None) -> "ModelBundle":
        path = Path(path)
        config_file = path / "model_config.json"
        try:
            cfg = json.loads(config_file.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise ModelUnavailableError(
                f"Model bundle {path} has no readable model_config.json ({exc}). A bundle needs model.onnx, "
                "tokenizer.json and model_config.json.",
                path=str(config_file),
            ) from exc
        pooling = cfg.get("pooling", "mean")
        if model_file is None:
            model_file = path / ("model.safetensors" if pooling == "static" else "model.onnx")
        tokenizer_file = Path(tokenizer_file) if tokenizer_file else path / "tokenizer.json"
        for needed in (model_file, tokenizer_file):
            if not needed.is_file():
                raise ModelUnavailableError(f"Model bundle file {needed} is missing. Re-download the model or fix the path.", path=str(needed))
        if pooling not in POOLINGS:
            raise ModelUnavailableError(f"{config_file}: pooling must be one of {POOLINGS}, not {pooling!r}.", path=str(config_file))
        try:
            return cls(
                name=name or cfg.get("name") or path.name,
                revision=revision or cfg.get("revision", ""),
                path=path,
                model_file=Path(model_file),
                tokenizer_file=tokenizer_file,
                dimensions=int(cfg["dimensions"]),
                max_tokens=int(cfg.get("max_tokens", 256)),
                pooling=pooling,
                normalize=bool(cfg.get("normalize", True)),
                query_prefix=cfg.get("query_prefix", "") or "",
                document_prefix=cfg.get("document_prefix", "") or "",
                sha256=sha256,
                min_dense=None if cfg.get("min_dense") is None else float(cfg["min_dense"]),
                fusion_weights=None if cfg.get("fusion_weights") is None else tuple(float(w) for w in cfg["fusion_weights"]),
                turn_score_cliff=None if cfg.get("turn_score_cliff") is None else float(cfg["turn_score_cliff"]),
                turn_score_gap=None if cfg.get("turn_score_gap") is None else _positive(cfg["turn_score_gap"], "turn_score_gap"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelUnavailableError(f"{config_file} is missing or has a bad 'dimensions'/'max_tokens'/'min_dense'/'fusion_weights'/'turn_score_cliff'/'turn_score_gap': {exc}.",
                                        path=str(config_file)) from exc


def _load_tokenizer(bundle: ModelBundle):
    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_file(str(bundle.tokenizer_file))
    except Exception as exc:
        raise ModelUnavailableError(f"Cannot load tokenizer {bundle.tokenizer_file}: {exc}", path=str(bundle.tokenizer_file)) from exc
    pad_id = (tokenizer.padding or {}).get("pad_id", 0)
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=bundle.max_tokens)
    return tokenizer, pad_id


class Embedder:
    """Embeds queries and documents; caches identical texts (LRU). Thread-safe."""

    # How this class computes vectors beyond the model files, public for caches of vectors to key on.
    VECTOR_RECIPE = VECTOR_RECIPE
    DISABLED_OPTIMIZERS = tuple(DISABLED_OPTIMIZERS)
    # What the model states that recall reads, carried as attributes of these names: public for wrappers to forward.
    STATED = STATED

    def __init__(self, bundle: ModelBundle, *, batch_size: int = 32, cache_size: int = 4096,
                 query_prefix: str = "", document_prefix: str = "", pooling: str | None = None, threads: int = 0,
                 int8_queries: bool = True, int8_documents: bool = False, outlier_documents: bool = True):
        self.bundle = bundle
        self.batch_size = batch_size
        # Batches run in parallel, one thread each (0: one per CPU). A single-threaded ONNX run per
        # batch keeps every core busy with useful work: ORT's own intra-op threads spin and wait on
        # each other at every operator, which halves throughput on a small or shared CPU.
        self.threads = threads or cpu_count()
        self._pool: ThreadPoolExecutor | None = None
        # An empty override means "use the model's own prefix".
        self.query_prefix = query_prefix or bundle.query_prefix
        self.document_prefix = document_prefix or bundle.document_prefix
        self.pooling = pooling or bundle.pooling
        for name, value in bundle.stated.items():  # the floor, fusion weights and where answers of turns end
            setattr(self, name, value)
        if self.pooling not in POOLINGS or (self.pooling == "static") != (bundle.pooling == "static"):
            raise ModelUnavailableError(f"Pooling {self.pooling!r} cannot be used with {bundle.name} (its own is {bundle.pooling!r}).")
        self.dimensions = bundle.dimensions
        # A bundle known only by its folder's name (a local path) is exported as "custom"; a pinned one by its name.
        self._label = telemetry.model_label(bundle.name, None if bundle.sha256 else bundle.path.name)
        self._tokenizer, self._pad_id = _load_tokenizer(bundle)
        self._cache = VectorCache(cache_size)
        self._lock = threading.Lock()
        # Queries run on the model rewritten to int8 arithmetic (models/int8_graph.py) where its weights are
        # int8, one text a run with one activation scale per text (and the FFN's calibrated outlier channels in
        # float32): ~0.2 ms faster than per-token scales, ~2x the float32 graph for a short query, cosine ~0.999
        # to the float32 vector (notes/bench_scale.md). Documents of a new database run on the int8 graph with
        # per-token scales and the model's calibrated outlier channels in float32 (outlier_documents, when the
        # bundle has a calibration for this model file: ~2x faster saves, quality unchanged), or on the plain
        # int8 graph (int8_documents: SciFact nDCG@10 -0.002), else on the float32 graph. A database keeps the
        # graph its vectors came from (documents_like). Sessions load on first use, so a process holds only the
        # graphs it runs.
        self._sessions: dict = {}  # graph name ("": float32) -> session; shared with documents_like's copies
        # The graphs this model has: name -> the outlier channels of an int8 graph ({}: none); None: the model file.
        self._graphs: dict[str, dict | None] = {"": None}
        self._graph = {"query": "", "document": ""}
        self._configured = ""  # the document graph for a new database
        self._per_text: set[str] = set()  # graphs run one text at a time
        if self.pooling == "static":
            self._table = self._load_static_table()
            return
        outliers = self._outliers()
        query = query_graph_name(outliers)
        queries = self._int8_graph(outliers, per_text=True)
        if queries is not None:
            self._graphs[INT8_GRAPH], self._graphs[query], self._per_text = {}, outliers or {}, {query}
            if outliers:  # known whatever is configured, so a database made on it keeps opening
                self._graphs[outlier_graph_name(outliers)] = outliers
            self._graph = {"query": query if int8_queries else "",
                           "document": INT8_GRAPH if int8_documents else
                           outlier_graph_name(outliers) if outliers and outlier_documents else ""}
            self._configured = self._graph["document"]
        # The query graph now, so a broken model file fails here; it also names the inputs and outputs.
        self._session(self._graph["query"], queries if self._graph["query"] else None)

    @property
    def identity(self) -> dict:
        """What the database records about the vectors this embedder makes."""
        return {
            "model": self.bundle.name,
            "revision": self.bundle.revision,
            "dimensions": self.dimensions,
            "pooling": self.pooling,
            "query_prefix": self.query_prefix,
            "document_prefix": self.document_prefix,
            # The exact model file and the input length vectors were made with: a replaced file or a
            # changed truncation makes different vectors under the same name.
            "sha256": self.bundle.sha256 or file_sha256(self.bundle.model_file),
            "max_tokens": self.bundle.max_tokens,
            # Only when not the float32 graph, so every database built before the int8 graph keeps its identity.
            **({DOCUMENT_GRAPH: self._graph["document"]} if self._graph["document"] else {}),
        }

    def recipe(self, kind: Kind) -> str:
        """The graph ``kind``'s vectors come from: "" for the model's own, else the rewrite's name."""
        return self._graph[kind]

    def documents_like(self, stored: dict | None) -> "Embedder":
        """This embedder, or a copy of it (sessions, tokenizer and cache shared) embedding documents
        on the graph a database's recorded identity ``stored`` names when that identity is otherwise
        this embedder's, so the database's vectors stay comparable without a reindex. None, or another
        model's identity: the configured graph. The engine calls it when it binds to a database."""
        graphs = self._graphs if stored is not None else ()
        return self._documents_on(next((g for g in graphs if same_embedder(stored, self._documents_on(g).identity)),
                                       self._configured))

    def _documents_on(self, graph: str) -> "Embedder":
        if self._graph["document"] == graph:
            return self
        other = copy.copy(self)
        other._graph = {**self._graph, "document": graph}
        return other

    def _outliers(self) -> dict[str, list[int]] | None:
        """The bundle's calibrated outlier channels (OUTLIERS_FILE), when made for this model file."""
        path = self.bundle.path / OUTLIERS_FILE
        if not path.is_file():
            return None
        calibration = json.loads(path.read_text(encoding="utf-8"))
        if calibration.get("model_sha256") != (self.bundle.sha256 or file_sha256(self.bundle.model_file)):
            return None  # made for another model file: its channels mean nothing here
        return calibration["channels"]

    def _int8_graph(self, outliers: dict[str, list[int]] | None, per_text: bool = False) -> bytes | None:
        try:
            return int8_compute_graph(self.bundle.model_file, outliers, per_text=per_text)
        except Exception as exc:  # onnx's parse errors name no common type
            raise ModelUnavailableError(
                f"Cannot read ONNX model {self.bundle.model_file}: {exc}. The file may be corrupt: delete it and re-download.",
                path=str(self.bundle.model_file),
            ) from exc

    def _session(self, graph: str, built: bytes | None = None):
        """The session running ``graph`` (``built``: its serialised model, when at hand), loaded on first use."""
        with self._lock:
            if graph not in self._sessions:
                outliers = self._graphs[graph]
                if built is None and outliers is not None:
                    built = self._int8_graph(outliers, per_text=graph in self._per_text)
                self._sessions[graph], self._input_names, self._output_names = self._load_onnx(built)
            return self._sessions[graph]

    def _load_onnx(self, graph: bytes | None = None):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 3
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        try:
            session = ort.InferenceSession(graph or str(self.bundle.model_file), options, providers=["CPUExecutionProvider"],
                                           disabled_optimizers=DISABLED_OPTIMIZERS)
        except Exception as exc:
            raise ModelUnavailableError(
                f"Cannot load ONNX model {self.bundle.model_file}: {exc}. The file may be corrupt: delete it and re-download.",
                path=str(self.bundle.model_file),
            ) from exc
        inputs = [i.name for i in session.get_inputs()]
        outputs = [o.name for o in session.get_outputs()]
        if self.pooling == "graph" and "sentence_embedding" not in outputs:
            raise ModelUnavailableError(f"{self.bundle.model_file} has no 'sentence_embedding' output; use pooling 'mean' or 'cls'.")
        return session, inputs, outputs

    def _load_static_table(self) -> np.ndarray:
        from safetensors.numpy import load_file

        try:
            tensors = load_file(str(self.bundle.model_file))
        except Exception as exc:
            raise ModelUnavailableError(f"Cannot load static embeddings {self.bundle.model_file}: {exc}", path=str(self.bundle.model_file)) from exc
        table = tensors.get("embeddings")
        if table is None:
            raise ModelUnavailableError(f"{self.bundle.model_file} has no 'embeddings' tensor.", path=str(self.bundle.model_file))
        return table.astype(np.float32)

    def embed_query(self, text: str) -> np.ndarray:
        return self.embed([text], "query")[0]

    def embed_documents(self, texts: Sequence[str], *, progress: bool = False) -> np.ndarray:
        return self.embed(texts, "document", progress=progress)

    def embed(self, texts: Sequence[str], kind: Kind, *, progress: bool = False) -> np.ndarray:
        with telemetry.operation("embed", backend="onnx", role=kind, model=self._label,
                                 dimensions=self.dimensions, texts=len(texts)) as op:
            return self._embed(texts, kind, progress, op)

    def _embed(self, texts: Sequence[str], kind: Kind, progress: bool, op: telemetry.Operation) -> np.ndarray:
        prefix = self.query_prefix if kind == "query" else self.document_prefix
        graph = self._graph[kind]
        session = None if self.pooling == "static" else self._session(graph)
        # Besides the text, the prefix and the graph change a vector (a query and a document of the same
        # text on the same graph share it).
        scope = graph or None
        out, cached = self._cache.embed([prefix + t for t in texts], self.dimensions,
                                        lambda missing: self._compute(missing, session, progress=progress,
                                                                      alone=graph in self._per_text), scope)
        op.set(cached=cached)
        return out

    def _compute(self, texts: list[str], session, *, progress: bool, alone: bool = False) -> np.ndarray:
        """Vectors of ``texts``; ``alone``: one text a run (the query graph's activation scale covers its whole run)."""
        encodings = self._tokenizer.encode_batch(texts, add_special_tokens=self.pooling != "static")
        order = sorted(range(len(texts)), key=lambda i: len(encodings[i].ids))
        result = np.empty((len(texts), self.dimensions), dtype=np.float32)
        batches = [[i] for i in order] if alone else self._batches(order, [len(e.ids) for e in encodings])
        telemetry.annotate(tokens=sum(len(e.ids) for e in encodings), batches=len(batches))
        # No bar object at all without one to show: building a disabled tqdm costs ~50 us, a tenth of a query's overhead.
        bar = tqdm(total=len(texts), desc="embedding", unit="text", leave=False) if progress and len(batches) > 1 else None
        # A text's vector does not depend on its batch (single-threaded kernels, masked padding, per-token
        # scales on the int8 graphs, one text a run on the query graph), so batches may run in any order and on any thread.
        def run(batch: list[int]) -> np.ndarray:
            return self._run([encodings[i] for i in batch], session)

        outputs = map(run, batches) if len(batches) < 2 or self.threads < 2 else self._executor().map(run, batches)
        with bar or nullcontext():
            for batch, vectors in zip(batches, outputs):
                result[batch] = vectors
                if bar is not None:
                    bar.update(len(batch))
        if self.bundle.normalize:
            norms = np.linalg.norm(result, axis=1, keepdims=True)
            result /= np.maximum(norms, 1e-12)
        return result

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="tinycontext-embed")
            return self._pool

    def _batches(self, order: list[int], lengths: list[int]) -> list[list[int]]:
        """Split length-sorted indices into batches of at most ``batch_size`` texts and about
        MAX_BATCH_TOKENS padded tokens (attention memory grows with batch x length^2, and smaller
        matrices run faster on a CPU)."""
        batches: list[list[int]] = []
        current: list[int] = []
        # Enough batches to keep every thread busy (a few texts per batch at least).
        size = min(self.batch_size, max(4, -(-len(order) // self.threads)))
        for i in order:
            # Sorted ascending, so lengths[i] is the padded width of the batch if i joins it.
            if current and (len(current) >= size or (len(current) + 1) * lengths[i] > MAX_BATCH_TOKENS):
                batches.append(current)
                current = []
            current.append(i)
        if current:
            batches.append(current)
        return batches

    def _run(self, encodings, session) -> np.ndarray:
        if self.pooling == "static":
            return np.stack([
                self._table[e.ids].mean(axis=0) if e.ids else np.zeros(self.dimensions, np.float32) for e in encodings
            ])
        width = max(1, max(len(e.ids) for e in encodings))
        ids = np.full((len(encodings), width), self._pad_id, dtype=np.int64)
        mask = np.zeros((len(encodings), width), dtype=np.int64)
        for row, enc in enumerate(encodings):
            ids[row, : len(enc.ids)] = enc.ids
            mask[row, : len(enc.ids)] = 1
        feed = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self._input_names:
            feed["token_type_ids"] = np.zeros_like(ids)
        feed = {k: v for k, v in feed.items() if k in self._input_names}
        outputs = session.run(None, feed)  # onnxruntime's run is thread-safe
        named = dict(zip(self._output_names, outputs))
        if self.pooling == "graph":
            return named["sentence_embedding"].astype(np.float32)
        hidden = named.get("last_hidden_state", outputs[0])
        if self.pooling == "cls":
            return hidden[:, 0, :].astype(np.float32)
        weights = mask[..., None].astype(np.float32)
        return ((hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)).astype(np.float32)
