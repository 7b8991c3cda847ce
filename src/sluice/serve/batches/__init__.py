"""OpenAI's ``/v1/batches``, and the running of a batch that both batch APIs share: a batch's
lines through the engine (``_run``, ``_runs``), checked first (``_check``), their output
written in the API's shape (``_output``, ``_shapes``, ``_message_shapes``). Imports ``core``
and ``files``."""
