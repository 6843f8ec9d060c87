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

from .version import __version__


def import_from(path, *, format: str = "tinycontext", session_id: str | None = None, dry_run: bool = False,
                config: TinyContextConfig | None = None) -> dict:
    """Import memories from ``path``: a TinyContext export (or legacy database), or another tool's
    (``format``: mcp-memory, mem0, basic-memory, mcp-memory-service; docs/imports.md). Importing the
    same source twice adds nothing; ``dry_run`` counts what would be imported and changes nothing."""
    from .memory.engine import get_engine
    from .memory.transfer import import_path

    return import_path(get_engine(config), path, format=format, session_id=session_id, dry_run=dry_run).to_dict()


def tool_schema_tokens(config: TinyContextConfig | None = None) -> int:
    """Tokens of the MCP tool definitions (name, description, input schema) a host sends the model on every
    request to a server for ``config`` (its ``tools`` profile); measured as tinycontext.servers.tools does."""
    from .servers.tools import active, schema_tokens

    config = config or TinyContextConfig()
    return sum(schema_tokens(active(config), config.encoding_name).values())


__all__ = [
    "TinyContextConfig", "load_config", "MemoryEngine", "MemoryInput", "StoredMemory", "save_memories", "recall_memories",
    "update_memory", "delete_memory", "get_memory", "close_engines", "import_from",
    "TinyContextError", "InvalidInputError", "EmptyMemoryError", "RecallBudgetError", "SessionNotFoundError",
    "MemoryNotFoundError", "ModelMismatchError", "ModelUnavailableError", "ConfigError", "ConflictError", "StorageError",
    "MissingExtraError", "Embedder", "create_embedder", "resolve_model", "Signals", "tool_schema_tokens", "__version__",
]
