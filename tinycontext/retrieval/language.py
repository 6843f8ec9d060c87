"""Any language: the FTS5 tokenizer choice, switching it in place, and queries for the trigram index.

``fts_tokenizer`` picks how SQLite FTS5 splits text:

- ``porter`` (default): Unicode words, English stemming ("running" finds "run");
- ``unicode61``: Unicode words without stemming, for non-English text where Porter's English
  suffix rules only do harm;
- ``trigram``: every 3-character substring. Finds words inside unsegmented scripts (Chinese,
  Japanese, Thai) and inside compounds (German "Dampfschiff" in "Donaudampfschifffahrt"), and any
  substring. Terms under 3 characters (``喝茶``, an emoji) cannot use the trigram index; they are
  matched with LIKE on the same FTS table and ranked after the BM25 hits.

The choice is recorded in the ``meta`` table and in the FTS tables' own definitions (the memories'
and the conversation episodes'). Opening a database with another ``fts_tokenizer`` rebuilds them in
one transaction (ids, content and triggers untouched), so switching back and forth is safe and
re-running it changes nothing.
"""

from __future__ import annotations

import re
import unicodedata

from .fusion import fts_query

TOKENIZERS = {
    "porter": "porter unicode61 remove_diacritics 2",
    "unicode61": "unicode61 remove_diacritics 2",
    "trigram": "trigram",
}
DEFAULT_TOKENIZER = "porter"
META_KEY = "fts_tokenizer"
MAX_TERMS = 64
_TOKENIZE = re.compile(r"tokenize\s*=\s*'([^']*)'", re.IGNORECASE)


def current_tokenizer(store) -> str:
    return store.get_meta(META_KEY) or DEFAULT_TOKENIZER


def _stale_tables(rows: list, spec: str) -> list[tuple[str, str]]:
    """(name, definition) of the FTS tables whose own definition names another tokenizer spec."""
    return [(name, sql) for name, sql in rows if (m := _TOKENIZE.search(sql)) is None or m.group(1) != spec]


def set_tokenizer(store, name: str) -> bool:
    """Rebuild the FTS tables (``memories_fts``, ``episodes_fts``) whose definition does not use
    tokenizer ``name``; True if any was rebuilt. Each table's own definition is the record, so a
    database switched before episodes followed the setting is repaired, and re-running changes nothing."""
    spec = TOKENIZERS[name]
    query = "SELECT name, sql FROM sqlite_master WHERE type = 'table' AND name IN ('memories_fts', 'episodes_fts')"
    if not _stale_tables(store.read(query), spec) and current_tokenizer(store) == name:
        return False
    with store.write() as conn:
        stale = _stale_tables(conn.execute(query).fetchall(), spec)  # another process may have switched it meanwhile
        for table, sql in stale:
            # The table's own definition (columns, content table) with only the tokenizer replaced; the
            # triggers and the episode indexer keep writing to it by name.
            create = _TOKENIZE.sub(f"tokenize='{spec}'", sql)
            if table == "memories_fts":  # external content: the text is read back from `memories`
                conn.execute("DROP TABLE memories_fts")
                conn.execute(create)
                conn.execute("INSERT INTO memories_fts(memories_fts) VALUES ('rebuild')")
            else:  # episodes_fts holds its own text
                kept = conn.execute("SELECT rowid, text FROM episodes_fts").fetchall()
                conn.execute("DROP TABLE episodes_fts")
                conn.execute(create)
                conn.executemany("INSERT INTO episodes_fts(rowid, text) VALUES (?, ?)", kept)
        conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (META_KEY, name))
    return bool(stale)


def match_query(tokenizer: str, text: str) -> str | None:
    """The FTS5 MATCH expression for ``text`` on an index built with ``tokenizer`` (trigram: its
    substring pieces; terms under 3 characters are left out: see :func:`trigram_query`)."""
    return trigram_query(text)[0] if tokenizer == "trigram" else fts_query(text)


def _terms(text: str) -> list[str]:
    """Whitespace/punctuation-separated terms, symbols (emoji) kept, case-folded, unique, in order."""
    cleaned = "".join(" " if ch == "\x00" or unicodedata.category(ch).startswith(("P", "Z", "C")) else ch for ch in text)
    out: list[str] = []
    for term in cleaned.split():
        term = term.casefold()
        if term not in out:
            out.append(term)
        if len(out) >= MAX_TERMS:
            break
    return out


def _unsegmented(ch: str) -> bool:
    """Scripts written without spaces between words, where a run of text is many words."""
    return unicodedata.name(ch, "").startswith(("CJK", "HIRAGANA", "KATAKANA", "THAI", "LAO", "KHMER", "MYANMAR"))


def trigram_query(text: str) -> tuple[str | None, list[str]]:
    """(MATCH expression or None, terms under 3 characters to match with LIKE).

    A term of 3+ characters is searched as a substring; a run of Chinese/Japanese/Thai text is
    split into its overlapping 3-character pieces, so "我喜欢喝茶吗" finds "我喜欢喝茶" and BM25 ranks
    by how many pieces match. Each piece is one quoted FTS5 string (never FTS syntax), OR-joined."""
    pieces: list[str] = []
    short: list[str] = []
    for term in _terms(text):
        if len(term) < 3:
            short.append(term)
        elif any(_unsegmented(ch) for ch in term):
            pieces += [term[i:i + 3] for i in range(len(term) - 2)]
        else:
            pieces.append(term)
    unique = list(dict.fromkeys(pieces))[:MAX_TERMS]
    match = " OR ".join('"' + t.replace('"', '""') + '"' for t in unique) or None
    return match, short


def like_pattern(term: str) -> str:
    """A LIKE pattern finding ``term`` anywhere (with ``ESCAPE '\\'``)."""
    return "%" + term.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
