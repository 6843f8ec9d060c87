"""The memory library: the engine API (:mod:`.engine`: save, recall, update, delete), what may be saved
(:mod:`.inputs`, :mod:`.checks`), recall's pipeline (:mod:`.recall`) and its database reads
(:mod:`.candidates`), the SQLite store with its schema and migrations (:mod:`.store`), the vector index
(:mod:`.vector_index`, :mod:`.codes`), browsing and bulk deletion (:mod:`.browse`), export/import/backup
(:mod:`.transfer`) and keyword-only mode (:mod:`.keyword_mode`)."""
