"""``/v1/embeddings``: texts (or token arrays) through the engine's embeddings pipeline.
Imports only ``core``."""
