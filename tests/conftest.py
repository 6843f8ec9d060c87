"""Shared fixtures: the real default MiniLM model (loaded once), temp databases, ../shared paths."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest

from tinycontext import MemoryEngine, TinyContextConfig
from tinycontext.models.embedder import Embedder
from tinycontext.models.hub import FAST, resolve_model

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not SHARED.is_dir():
        pytest.fail(f"{SHARED} is missing: tests need the shared assets beside the checkout (see README).")
    return SHARED


# Where the test processes make the default model from the package once: its file is named by its sha256 and
# written atomically (models/hub.py), so every worker and subprocess can share and reuse it.
TEST_MODELS = Path(tempfile.gettempdir()) / "tinycontext-test-models"


def default_embedder() -> Embedder:
    """The model a new database gets with default settings (the fast tier: minilm-l6-tuned3, made from the package)."""
    return Embedder(resolve_model(FAST, TEST_MODELS))


@pytest.fixture(scope="session")
def real_embedder() -> Embedder:
    """The real default model, as the package ships it (no network)."""
    return default_embedder()


class HashEmbedder:
    """Deterministic bag-of-words embedder for unit tests: fast, and texts sharing words are close."""

    def __init__(self, dimensions: int = 64, model: str = "hash-test"):
        self.dimensions = dimensions
        self.identity = {"model": model, "revision": "1", "dimensions": dimensions, "pooling": "mean",
                         "query_prefix": "", "document_prefix": ""}

    def _one(self, text: str) -> np.ndarray:
        vec = np.zeros(self.dimensions, np.float32)
        for word in text.lower().split():
            h = int(hashlib.md5(word.strip(".,!?").encode()).hexdigest(), 16)
            vec[h % self.dimensions] += 1.0
        norm = np.linalg.norm(vec)
        return vec / norm if norm else vec

    def embed(self, texts, kind="document", progress=False):
        return np.stack([self._one(t) for t in texts]) if texts else np.zeros((0, self.dimensions), np.float32)

    def embed_documents(self, texts, progress=False):
        return self.embed(texts, "document")

    def embed_query(self, text):
        return self._one(text)


# The hostile, concurrency and fault suites take their embedder from here: the hash stand-in by
# default, the real MiniLM model with TINYCONTEXT_TEST_EMBEDDER=minilm (CI runs them both ways).
SUITE_EMBEDDER = os.environ.get("TINYCONTEXT_TEST_EMBEDDER", "hash")


def suite_embedder():
    if SUITE_EMBEDDER == "minilm":
        return default_embedder()
    if SUITE_EMBEDDER != "hash":
        raise ValueError(f"TINYCONTEXT_TEST_EMBEDDER must be hash or minilm, not {SUITE_EMBEDDER!r}")
    return HashEmbedder()


@pytest.fixture
def config(tmp_path) -> TinyContextConfig:
    return TinyContextConfig(memory_db_path=tmp_path / "memory.db", models_dir=tmp_path / "models")


@pytest.fixture
def engine(config, real_embedder):
    """An engine on a fresh database with the real model."""
    with MemoryEngine(config, embedder=real_embedder) as eng:
        yield eng


@pytest.fixture
def hash_engine(config):
    """An engine on a fresh database with the fast deterministic test embedder."""
    with MemoryEngine(config, embedder=HashEmbedder()) as eng:
        yield eng


@pytest.fixture
def env(tmp_path, monkeypatch) -> dict[str, str]:
    """TINYCONTEXT_* settings for a temporary database, set here and returned for subprocesses."""
    (tmp_path / "config.json").write_text("{}")  # keeps a developer's per-user config out of the test
    values = {"TINYCONTEXT_CONFIG_PATH": str(tmp_path / "config.json"), "TINYCONTEXT_MEMORY_DB_PATH": str(tmp_path / "memory.db"),
              "TINYCONTEXT_MODELS_DIR": str(tmp_path / "models")}
    for key in [k for k in os.environ if k.startswith("TINYCONTEXT_")]:
        monkeypatch.delenv(key)
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    return values
