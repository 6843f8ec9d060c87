"""Reading other memory tools' files into TinyContext: each module here turns one source format into
memories that :func:`tinycontext.memory.imports.base.run` writes through the engine's import path
(:meth:`MemoryEngine.import_memories`), with the same checks as saving. ``tinycontext.memory.transfer``
names the formats and picks the reader; docs/imports.md says what each format brings in."""
