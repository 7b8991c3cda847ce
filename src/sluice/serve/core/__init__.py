"""What every API of ``sluice serve`` shares, below them all: the settings, the clients (their
keys, budgets and admission queues, in process or on Redis), a request's context, its body
read within limits, OpenAI's errors, the metrics, the state databases and the registry of
replicas. Imports nothing else of ``serve``."""
