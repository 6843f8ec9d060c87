"""sha256 of model files, remembered per file version (the hub verifies bundles, embedders report them)."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

_hash_cache: dict[tuple, str] = {}
_hash_lock = threading.Lock()


def file_sha256(path: Path) -> str:
    """sha256 of a file, remembered per (path, inode, size, mtime, ctime) so repeated loads in one process
    stay cheap; any write or replacement changes the key (ctime cannot be set back by hand)."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
    with _hash_lock:
        if key in _hash_cache:
            return _hash_cache[key]
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    value = digest.hexdigest()
    with _hash_lock:
        _hash_cache[key] = value
    return value
