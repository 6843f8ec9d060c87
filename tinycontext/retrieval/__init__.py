"""Recall's stages as functions without I/O of their own: the query's words (:mod:`.fusion`,
:mod:`.language`, :mod:`.bounded_bm25`), weighted rank fusion, the relevance floor and the cliff cut
(:mod:`.fusion`), the re-rankers (:mod:`.conversation`, :mod:`.time_windows`) and filters
(:mod:`.filters`). Anything that reads the database is handed the store."""
