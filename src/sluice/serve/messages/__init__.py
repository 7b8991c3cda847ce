"""Anthropic's ``/v1/messages`` and ``/v1/messages/count_tokens``: a Messages body answered as
chat (``chat``), and what an Anthropic client is told (``_anthropic``: its errors, its
models). Imports ``core`` and ``chat``."""
