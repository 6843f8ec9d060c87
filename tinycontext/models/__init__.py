"""Embedding models: the embedder protocol and its backends (:mod:`.backends`), the local ONNX and
model2vec embedder (:mod:`.embedder`), OpenAI-compatible and Ollama servers (:mod:`.remote`), and
the bundled model, the registry and Hugging Face downloads (:mod:`.hub`)."""
