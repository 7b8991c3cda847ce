"""``/v1/chat/completions``: a body through the engine, answered or streamed (``_relay``), and
the answer cache. The Responses and Messages APIs are chat in another shape: they build on
this package. Imports only ``core``."""
