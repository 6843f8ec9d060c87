"""Facts that supersede facts: when a new memory looks like a changed version of a stored one.

A *supersession candidate* is a near neighbour (dense similarity at least
``supersession_threshold``) that says the same thing about the same subject with different values:
the words other than numbers and names mostly agree (``SAME_WORDS``), and each side has a number or
a name the other lacks ("The staging cluster runs Kubernetes 1.29" / "... 1.30" is one; "Alice is allergic
to peanuts" / "... to peanuts and shellfish" only adds a detail and is not). Saving reports it; only an
explicit ``supersedes`` applies it.
"""

from __future__ import annotations

import regex

# Numbers (1.29, 90, 02:00, 3,5) and capitalised words after the first, which in a one-fact memory are names.
# A number stands alone: the digits of an identifier ("n1", "v2beta") are part of a word, not a value.
_NUMBER = regex.compile(r"(?<![\p{L}\d])\d+(?:[.,:]\d+)*(?![\p{L}\d])")
_WORD = regex.compile(r"[\p{L}\p{N}]+(?:['’][\p{L}]+)?")
SAME_WORDS = 0.6  # Jaccard overlap of the words that are not values


def _values(text: str) -> tuple[set[str], set[str]]:
    """(values, other words), lower-cased: values are numbers and capitalised words but the first."""
    words = _WORD.findall(text)
    values = set(_NUMBER.findall(text))
    values |= {w.lower() for w in words[1:] if w[:1].isupper()}
    rest = {w.lower() for w in words} - values
    return values, {w for w in rest if not _NUMBER.fullmatch(w)}


def contradiction(new: str, old: str) -> dict | None:
    """``{"was": [...], "now": [...]}`` (the values that changed) when ``new`` reads as ``old`` with other
    values, else None."""
    new_values, new_rest = _values(new)
    old_values, old_rest = _values(old)
    gained, lost = new_values - old_values, old_values - new_values
    if not gained or not lost:
        return None  # one side only adds or drops a detail: not a changed fact
    union = new_rest | old_rest
    if not union or len(new_rest & old_rest) / len(union) < SAME_WORDS:
        return None
    return {"was": sorted(lost), "now": sorted(gained)}
