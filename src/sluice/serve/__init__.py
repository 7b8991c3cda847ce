"""``sluice serve``: an OpenAI-compatible HTTP endpoint that runs every request through
the engine (limits, router, retries, budgets, the store). Needs ``llm-sluice[serve]``."""
