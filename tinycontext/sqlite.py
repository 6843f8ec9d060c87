"""The SQLite driver: the standard library's ``sqlite3`` when it can load extensions, else ``sqlean.py``.

``sqlean.py`` is a drop-in sqlite3 build with extension loading (a hard dependency). Many Pythons
(pyenv builds, macOS system Python) lack ``enable_load_extension``, and sqlite-vec is an extension.
``TINYCONTEXT_SQLITE_DRIVER=sqlite3|sqlean`` forces one; ``tinycontext doctor`` shows which is used.
"""

from __future__ import annotations

import os
from types import ModuleType

from .errors import StorageError


def _can_load_extensions(module: ModuleType) -> bool:
    return hasattr(module.Connection, "enable_load_extension")


def sqlite_driver() -> tuple[ModuleType, str]:
    """(module, why) for the SQLite driver this process uses."""
    forced = os.environ.get("TINYCONTEXT_SQLITE_DRIVER", "").strip().lower()
    import sqlite3

    if forced == "sqlite3" or (not forced and _can_load_extensions(sqlite3)):
        if not _can_load_extensions(sqlite3):
            raise StorageError(
                "This Python's sqlite3 cannot load extensions (no enable_load_extension), so sqlite-vec cannot run. "
                "Unset TINYCONTEXT_SQLITE_DRIVER to use sqlean.py instead."
            )
        return sqlite3, "stdlib sqlite3 (can load extensions)"
    try:
        import sqlean
    except ImportError as exc:
        raise StorageError("sqlean.py is missing and this Python's sqlite3 cannot load extensions: pip install sqlean.py") from exc
    reason = "forced by TINYCONTEXT_SQLITE_DRIVER" if forced else "stdlib sqlite3 cannot load extensions"
    return sqlean, f"sqlean.py ({reason})"
