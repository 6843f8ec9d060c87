"""Compact codes of the stored vectors, kept beside them for the two-stage dense search.

Every vector written to ``memory_vectors`` (sqlite-vec, the store of record) also gets, in the same
transaction, two codes of its offset from a fixed centre (``meta.vector_centre``):

- ``memory_bits``: the offset's sign bits (48 bytes at 384 dimensions), clustered by session, so a
  session's bits load in one range scan: the first stage scans them all by Hamming distance;
- ``memory_codes``: the offset as int8 codes with one float32 scale (388 bytes), read by id for the
  candidates only: the second stage rescores those within ~1e-3 of the exact cosine.

Embeddings share a common direction, so offsets from their mean spread the sign bits (each bit
splits the data) and are smaller, which makes the int8 steps finer. The centre is the mean of the
first vectors ever coded (the first save, an import's first chunk, a migration's or a reindex's
first slice) and never moves after, so codes written at different times agree; a reindex recodes
everything around a fresh centre. Any centre gives correct codes, a better one only tighter ones.
Deleting a memory deletes its codes (trigger ``memories_codes_ad``, schema v7).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

CENTRE_KEY = "vector_centre"


class Coded(NamedTuple):
    """Vectors as :func:`put` stored them: unit rows, the centre, sign bits and int8 codes, so the
    in-RAM copy (tinycontext/memory/vector_index.py) takes them as they are instead of computing them again."""

    rows: np.ndarray
    centre: np.ndarray
    bits: np.ndarray
    packed: np.ndarray


def unit(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to length 1 (zero rows stay zero), as vec0's cosine distance sees them."""
    vectors = np.asarray(vectors, np.float32)
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    return np.divide(vectors, norms, out=np.zeros_like(vectors), where=norms > 0)


def sign_bits(rows: np.ndarray, centre: np.ndarray) -> np.ndarray:
    """(n, ceil(d / 8)) uint8: bit j of a row is set where its unit vector exceeds the centre."""
    return np.packbits(rows - centre > 0, axis=-1)


def int8_codes(rows: np.ndarray, centre: np.ndarray) -> np.ndarray:
    """(n, d + 4) uint8 per unit row: d int8 codes of its offset from the centre, then the float32
    scale that turns them back (offset ~= codes * scale)."""
    offsets = rows - centre
    scales = (np.abs(offsets).max(axis=1) / 127.0).astype(np.float32)
    codes = np.rint(np.divide(offsets, scales[:, None], out=np.zeros_like(offsets), where=scales[:, None] > 0)).astype(np.int8)
    return np.concatenate([codes.view(np.uint8), scales[:, None].view(np.uint8)], axis=1)


def scores(packed: np.ndarray, query: np.ndarray, centre: np.ndarray) -> np.ndarray:
    """Cosines of the unit ``query`` with the rows whose :func:`int8_codes` are ``packed``."""
    d = len(query)
    codes = packed[:, :d].view(np.int8).astype(np.float32)
    scales = np.ascontiguousarray(packed[:, d:]).view(np.float32)[:, 0]
    return (codes @ query) * scales + float(centre @ query)


def nibbles(packed: np.ndarray) -> np.ndarray:
    """(n, d / 2 + 4) uint8: :func:`int8_codes` ``packed`` requantised to 4 bits (two a byte, each the
    code + 8 in 1..15), then the float32 scale that turns them back: half the bytes, for ranking
    candidates in RAM; the int8 codes stay the ones written."""
    d = packed.shape[1] - 4
    out = np.empty((len(packed), d // 2 + 4), np.uint8)
    for start in range(0, len(packed), 8192):  # in slices: a session loads in one call, its temporaries stay small
        part = packed[start:start + 8192]
        # round(code * 7 / 127) in integers, + 8
        coarse = ((part[:, :d].view(np.int8).astype(np.int16) * 14 + 127) // 254 + 8).astype(np.uint8)
        out[start:start + 8192, : d // 2] = (coarse[:, 0::2] << 4) | coarse[:, 1::2]
        out[start:start + 8192, d // 2:] = (np.ascontiguousarray(part[:, d:]).view(np.float32) * np.float32(127 / 7)).view(np.uint8)
    return out


def nibble_scores(packed: np.ndarray, query: np.ndarray, centre: np.ndarray) -> np.ndarray:
    """Approximate cosines of the unit ``query`` with the rows whose :func:`nibbles` are ``packed``."""
    half = len(query) // 2
    high, low = (packed[:, :half] >> 4).astype(np.float32), (packed[:, :half] & 15).astype(np.float32)
    scales = np.ascontiguousarray(packed[:, half:]).view(np.float32)[:, 0]
    # Each code is stored + 8: the query's sum times 8 comes off once, not per element.
    raw = high @ query[0::2] + low @ query[1::2] - 8.0 * float(query.sum())
    return raw * scales + float(centre @ query)


def centre(conn) -> np.ndarray | None:
    row = conn.execute("SELECT value FROM meta WHERE key = ?", (CENTRE_KEY,)).fetchone()
    return None if row is None else np.frombuffer(bytes.fromhex(row[0]), np.float32)


def put(conn, ids, sessions, vectors: np.ndarray) -> Coded | None:
    """Write (or replace) the codes of ``vectors`` (raw, any length) for memories ``ids`` of
    ``sessions`` (one per id, or one str for all), inside the caller's write transaction; returns
    what was written (None when nothing was)."""
    if not len(ids):
        return None
    rows = unit(vectors)
    mid = centre(conn)
    if mid is None or len(mid) != rows.shape[1]:
        mid = rows.mean(axis=0).astype(np.float32)
        conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (CENTRE_KEY, mid.tobytes().hex()))
    sessions = [sessions] * len(ids) if isinstance(sessions, str) else sessions
    ids = [int(i) for i in ids]
    coded = Coded(rows, mid, sign_bits(rows, mid), int8_codes(rows, mid))
    conn.executemany("INSERT OR REPLACE INTO memory_bits(session_id, memory_id, bits) VALUES (?, ?, ?)",
                     zip(sessions, ids, map(bytes, coded.bits)))
    conn.executemany("INSERT OR REPLACE INTO memory_codes(memory_id, codes) VALUES (?, ?)", zip(ids, map(bytes, coded.packed)))
    return coded


def drop(conn, session: str, ids) -> None:
    """Delete the codes of memories ``ids`` of ``session`` whose vector was deleted while the memory stays."""
    ids = [int(i) for i in ids]
    conn.executemany("DELETE FROM memory_bits WHERE session_id = ? AND memory_id = ?", [(session, i) for i in ids])
    conn.executemany("DELETE FROM memory_codes WHERE memory_id = ?", [(i,) for i in ids])


def clear(conn) -> None:
    """Forget every code and the centre (before a reindex writes new vectors)."""
    conn.execute("DELETE FROM memory_bits")
    conn.execute("DELETE FROM memory_codes")
    conn.execute("DELETE FROM meta WHERE key = ?", (CENTRE_KEY,))


def backfill(conn, slice_rows: int = 8192) -> int:
    """Codes for every stored vector (the v7 migration): read from ``memory_vectors`` in slices."""
    if not conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'memory_vectors'").fetchone():
        return 0
    session_of = dict(conn.execute("SELECT id, session_id FROM memories").fetchall())
    cursor = conn.execute("SELECT memory_id, embedding FROM memory_vectors")
    done = 0
    while rows := cursor.fetchmany(slice_rows):
        rows = [r for r in rows if r[0] in session_of]
        if rows:
            vectors = np.frombuffer(b"".join(r[1] for r in rows), np.float32).reshape(len(rows), -1)
            put(conn, [r[0] for r in rows], [session_of[r[0]] for r in rows], vectors)
            done += len(rows)
    return done
