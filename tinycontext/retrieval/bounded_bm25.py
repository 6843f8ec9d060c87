"""Bounded BM25 work for big databases.

FTS5 scores every row that matches any word of an OR query, so one common word makes a recall over
a million memories read and score most of them (about a second here). So the rows each query word
matches are counted first (FTS5 walks a word's list of rows far faster than it scores them, and
the count stops past the budget), and the most common words are left out while the rows left to
score exceed the budget (``recall_fts_budget``); the rarest word always stays. The words dropped
carry the least IDF weight, and below the budget (in practice every database up to tens of
thousands of memories) the query is exactly :func:`tinycontext.retrieval.fusion.fts_query`'s.
"""

from __future__ import annotations

from .fusion import match_expression, query_terms


def bounded_match(store, query: str, budget: int, span: tuple[int, int] | None = None) -> str | None:
    """The FTS5 MATCH expression for ``query``, its commonest words dropped to fit ``budget`` rows
    (0: no bound). ``span``: the (lowest, highest) memory id the search is limited to."""
    terms = query_terms(query)
    if budget <= 0 or len(terms) < 2:
        return match_expression(terms)
    count = "SELECT count(*) FROM (SELECT rowid FROM memories_fts WHERE memories_fts MATCH ? AND rowid BETWEEN ? AND ? LIMIT ?)"
    low, high = span or (1, store.read("SELECT max(id) FROM memories")[0][0] or 0)
    if high - low + 1 <= budget:
        return match_expression(terms)  # fewer rows than the budget in all (ids only grow)
    cost = [store.read(count, (match_expression([t]), low, high, budget + 1))[0][0] for t in terms]
    kept = list(range(len(terms)))
    for i in sorted(kept, key=lambda i: (-cost[i], i)):
        if len(kept) == 1 or sum(cost[j] for j in kept) <= budget:
            break
        kept.remove(i)
    return match_expression([terms[i] for i in kept])
