"""Any language: the FTS5 tokenizer choice, switching it in place, and queries for the trigram index.

``fts_tokenizer`` picks how SQLite FTS5 splits text:

- ``porter`` (default): Unicode words, English stemming ("running" finds "run");
- ``unicode61``: Unicode words without stemming, for non-English text where Porter's English
  suffix rules only do harm;
- ``trigram``: every 3-character substring. Finds words inside unsegmented scripts (Chinese,
  Japanese, Thai) and inside compounds (German "Dampfschiff" in "Donaudampfschifffahrt"), and any
  substring. Terms under 3 characters (``喝茶``, an emoji) cannot use the trigram index; they are
  matched with LIKE on the same FTS table and ranked after the BM25 hits.

The choice is recorded in the ``meta`` table and in the FTS table's own definition. Opening a
database with another ``fts_tokenizer`` rebuilds the index in one transaction (ids, content and
triggers untouched), so switching back and forth is safe and re-running it changes nothing.
"""

from __future__ import annotations

import re
import unicodedata
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .store import Store

TOKENIZERS = {
    "porter": "porter unicode61 remove_diacritics 2",
    "unicode61": "unicode61 remove_diacritics 2",
    "trigram": "trigram",
}
DEFAULT_TOKENIZER = "porter"
META_KEY = "fts_tokenizer"
MAX_TERMS = 64
_TOKENIZE = re.compile(r"tokenize\s*=\s*'[^']*'", re.IGNORECASE)


def current_tokenizer(store: "Store") -> str:
    return store.get_meta(META_KEY) or DEFAULT_TOKENIZER


def set_tokenizer(store: "Store", name: str) -> bool:
    """Rebuild ``memories_fts`` with tokenizer ``name`` unless it already uses it; True if rebuilt."""
    spec = TOKENIZERS[name]
    if current_tokenizer(store) == name:
        return False
    with store.write() as conn:
        row = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'memories_fts'").fetchone()
        stored = conn.execute("SELECT value FROM meta WHERE key = ?", (META_KEY,)).fetchone()
        if (stored[0] if stored else DEFAULT_TOKENIZER) == name:  # another process switched it meanwhile
            return False
        # The table's own definition (columns, content table) with only the tokenizer replaced; the
        # triggers keep writing to it by name.
        create = _TOKENIZE.sub(f"tokenize='{spec}'", row[0])
        conn.execute("DROP TABLE memories_fts")
        conn.execute(create)
        conn.execute("INSERT INTO memories_fts(memories_fts) VALUES ('rebuild')")
        conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (META_KEY, name))
    return True


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
