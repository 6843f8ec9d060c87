"""The ``tinycontext`` command (:mod:`.commands`) and its ``doctor`` checks (:mod:`.doctor`): thin over the library."""
