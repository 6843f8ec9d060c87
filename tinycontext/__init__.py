"""TinyContext: token-light local memory for AI agents (SQLite FTS5 + sqlite-vec, fused by RRF)."""

from .config import TinyContextConfig, load_config
from .models.backends import create_embedder
from .models.embedder import Embedder
from .memory.engine import (
    MemoryEngine,
    MemoryInput,
    StoredMemory,
    close_engines,
    delete_memory,
    get_memory,
    recall_memories,
    save_memories,
    update_memory,
)
from .errors import (
    ConfigError,
    ConflictError,
    EmptyMemoryError,
    InvalidInputError,
    MemoryNotFoundError,
    MissingExtraError,
    ModelMismatchError,
    ModelUnavailableError,
    RecallBudgetError,
    SessionNotFoundError,
    StorageError,
    TinyContextError,
)
from .models.hub import resolve_model
from .retrieval.fusion import Signals

__version__ = "0.1.0"

__all__ = [
    "TinyContextConfig", "load_config", "MemoryEngine", "MemoryInput", "StoredMemory", "save_memories", "recall_memories",
    "update_memory", "delete_memory", "get_memory", "close_engines",
    "TinyContextError", "InvalidInputError", "EmptyMemoryError", "RecallBudgetError", "SessionNotFoundError",
    "MemoryNotFoundError", "ModelMismatchError", "ModelUnavailableError", "ConfigError", "ConflictError", "StorageError",
    "MissingExtraError", "Embedder", "create_embedder", "resolve_model", "Signals", "__version__",
]
