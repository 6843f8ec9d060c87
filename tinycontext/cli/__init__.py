"""The ``tinycontext`` command (:mod:`.commands`, its shared helpers in :mod:`.common`) and its ``doctor`` checks
(:mod:`.doctor`): thin over the library."""
