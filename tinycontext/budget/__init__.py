"""What an agent receives, within a token budget: counting tokens (:mod:`.tokens`, tiktoken) and
rendering memories and pages (:mod:`.render`), shared by recall, browsing, the web tools and the servers."""
