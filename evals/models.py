"""The embedder a config names, as the harness uses it: an ONNX bundle (``embedder.model``) or an
embedding server (``embedder=openai embedder.url=... embedder.model=...``, any ``embedding_backend``
the engine registers besides onnx), built through the engine's public API only.

:func:`describe` says what the vectors depend on without embedding a document: for a bundle, its
files and settings (no model loaded); for a server, the model it reports, the per-role request
fields, the prefixes and a hash of its vectors for a fixed probe text of each role, so a server that
now serves something else misses every cache instead of mixing vectors.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from omegaconf import DictConfig, OmegaConf

from tinycontext import Embedder, TinyContextConfig, create_embedder, resolve_model

from .embedding_cache import CachedEmbedder, file_sha256, model_key

PROBE_TEXTS = ("what do mitochondria do", "Mitochondria produce most of the chemical energy of the cell.")

# Loaded embedders, kept for the next job in this process (joblib workers).
_cached: dict[tuple, CachedEmbedder] = {}
_live: dict[tuple, object] = {}


@dataclass
class EvalModel:
    cfg: DictConfig
    spec: str                 # ONNX: the resolved model spec; server: the model name asked for
    backend: str              # onnx | openai | ollama | a registered backend
    vectors: str              # what a vector depends on besides its text (cache and job keys)
    facts: dict = field(default_factory=dict)  # model, model_pooling, model_mb, sha256, path
    # ModelBundle.stated (job keys): a bundle's floor, fusion weights and cliff for turns can change while its file does not.
    stated: dict = field(default_factory=dict)

    @property
    def remote(self) -> bool:
        return self.backend != "onnx"

    def engine_fields(self) -> dict:
        """TinyContextConfig fields that make the engine embed with this model (probe, recommend)."""
        c = self.cfg
        fields = {"embedding_model": self.spec, "embedding_batch_size": int(c.batch_size),
                  "dense_query_prefix": c.query_prefix or "", "dense_document_prefix": c.document_prefix or ""}
        if self.remote:
            fields |= {"embedding_backend": self.backend, "embedding_url": str(c.url),
                       "embedding_timeout_s": float(c.get("timeout_s") or 30.0),
                       "embedding_query_params": _plain(c.get("query_params")),
                       "embedding_document_params": _plain(c.get("document_params")),
                       "embedding_min_dense": None if c.get("min_dense") is None else float(c.min_dense)}
        return fields


def _plain(node) -> dict:
    return OmegaConf.to_container(node, resolve=True) if node is not None else {}


def backend(cfg: DictConfig) -> str:
    return str(cfg.get("backend") or "onnx")


def resolve_model_spec(spec: str, base: Path) -> str:
    """A path-like model spec becomes absolute (against ``base``); tiers, registry names, hub ids stay."""
    if spec.startswith((".", "/", "~")) or (base / spec).is_dir():
        return str((base / Path(spec).expanduser()).resolve())
    return spec


def onnx_args(cfg: DictConfig) -> dict:
    return {"batch_size": int(cfg.batch_size), "pooling": cfg.pooling or None, "query_prefix": cfg.query_prefix or "",
            "document_prefix": cfg.document_prefix or ""}


def _server(model: EvalModel):
    return create_embedder(TinyContextConfig(**model.engine_fields()))


def describe(cfg: DictConfig, models_dir: Path, base: Path) -> EvalModel:
    kind = backend(cfg)
    if kind == "onnx":
        spec = resolve_model_spec(str(cfg.model), base)
        bundle = resolve_model(spec, models_dir)
        return EvalModel(cfg, spec, kind, model_key(bundle, cfg.pooling or None), {
            "model": bundle.name, "model_pooling": bundle.pooling, "model_mb": bundle.model_file.stat().st_size / 2**20,
            "sha256": file_sha256(bundle.model_file), "path": str(bundle.path)},
            bundle.stated)
    model = EvalModel(cfg, str(cfg.model), kind, "")
    server = _server(model)
    try:
        probes = np.concatenate([server.embed_query(PROBE_TEXTS[0])[None], server.embed_documents([PROBE_TEXTS[1]])])
        identity = server.identity
    finally:
        server.close()
    # Rounded: a server's float noise in the last digits must not look like another model.
    digest = hashlib.sha256(np.round(probes, 3).astype(np.float32).tobytes()).hexdigest()
    model.vectors = hashlib.sha256(json.dumps({"identity": identity, "probe": digest}, sort_keys=True).encode()).hexdigest()
    size = cfg.get("model_mb")  # a server's model file is not ours to measure: stated in the embedder config
    model.facts = {"model": identity["model"], "model_pooling": "remote", "model_mb": float(size) if size is not None else float("nan"),
                   "sha256": None, "path": str(cfg.url), "probe_sha256": digest}
    return model


def cached_embedder(model: EvalModel, cache_dir: Path, models_dir: Path) -> CachedEmbedder:
    """The quality pass's embedder: vectors from the on-disk cache when seen before."""
    key = (model.vectors, model.spec, json.dumps(model.engine_fields(), sort_keys=True), str(cache_dir))
    if key not in _cached:
        inner = _server(model) if model.remote else Embedder(resolve_model(model.spec, models_dir), cache_size=0,
                                                               **onnx_args(model.cfg))
        _cached[key] = CachedEmbedder(inner, cache_dir, model.vectors)
    return _cached[key]


def live_embedder(model: EvalModel, models_dir: Path):
    """Production's embedder for the timing pass. No query LRU: every timed query is embedded."""
    key = (model.vectors, model.spec, json.dumps(model.engine_fields(), sort_keys=True))
    if key not in _live:
        _live[key] = _server(model) if model.remote else Embedder(resolve_model(model.spec, models_dir), cache_size=0,
                                                                    **onnx_args(model.cfg))
    return _live[key]


def pooling(embedder) -> str:
    return getattr(embedder, "pooling", None) or embedder.identity.get("pooling", "")
