"""Typed errors. Every error carries a stable ``code`` that adapters (CLI, MCP, HTTP) pass on."""

from __future__ import annotations


class TinyContextError(Exception):
    """Base class. ``code`` is stable and machine-readable; the message says what to do."""

    code = "internal_error"

    def __init__(self, message: str, **details):
        super().__init__(message)
        self.message = message
        self.details = details

    def to_dict(self) -> dict:
        return {"code": self.code, "message": self.message, **({"details": self.details} if self.details else {})}

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class InvalidInputError(TinyContextError):
    code = "invalid_input"


class EmptyMemoryError(InvalidInputError):
    code = "empty_memory"


class RecallBudgetError(InvalidInputError):
    code = "recall_budget"


class SessionNotFoundError(TinyContextError):
    code = "session_not_found"


class MemoryNotFoundError(TinyContextError):
    code = "memory_not_found"


class ConflictError(TinyContextError):
    """An edit based on a version that is no longer current (``expected_version``); nothing changed."""

    code = "conflict"


class ModelMismatchError(TinyContextError):
    code = "model_mismatch"


class ModelUnavailableError(TinyContextError):
    code = "model_unavailable"


class ConfigError(TinyContextError):
    code = "config_error"


class StorageError(TinyContextError):
    code = "storage_error"


class MissingExtraError(TinyContextError):
    """An optional dependency is not installed; the message names the pip command."""

    code = "missing_extra"
