"""The memory library: the engine API (:mod:`.engine`: save, recall, update, delete), the SQLite store
with its schema and migrations (:mod:`.store`), the vector index (:mod:`.vector_index`), browsing and
bulk deletion (:mod:`.browse`), export/import/backup (:mod:`.transfer`) and keyword-only mode
(:mod:`.keyword_mode`)."""
