"""``sluice serve``: an OpenAI-compatible HTTP endpoint that runs every request through
the engine (limits, router, retries, budgets, the store). Needs ``llm-sluice[serve]``.

``_app`` builds the application: its middlewares (``_access_log``, ``_tracing``, ``_forward``)
and the routes of every API, one sub-package each (``chat``, ``embeddings``, ``responses``,
``messages``, ``files``, ``batches``, ``message_batches``, ``dashboard``), all on ``core``
(clients, admission, bodies, errors, state). The sub-packages import one another only
downward (``tests/test_layers.py`` holds the arrows; docs/architecture.md draws them)."""
