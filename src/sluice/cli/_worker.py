"""``sluice worker``: answer the requests of every distributed job running in Redis."""

from __future__ import annotations

from pathlib import Path

import click

from .._errors import ConfigError
from ._config import load_config
from ._signals import run_until_stopped

__all__ = ["run_worker"]


def _say(message: str) -> None:
    click.echo(f"sluice worker: {message}", err=True)


def require_redis() -> None:
    """A clear error, not an ImportError, when the [redis] extra is not installed."""
    try:
        import redis  # noqa: F401
    except ImportError:
        raise ConfigError("--redis needs the redis client: pip install 'llm-sluice[redis]'") from None


def run_worker(
    url: str,
    *,
    config_path: Path | None,
    concurrency: int | None,
    grace: float,
    fail_open: bool,
    name: str | None,
) -> int:
    """Work until SIGTERM or Ctrl-C (twice: at once); the exit status.

    Redis unreachable (at start or later) is an outage: the worker says so once and keeps
    retrying, so a worker may start before Redis does. Redis refusing the URL's
    credentials is a configuration error: it says so and exits with status 2.
    """
    require_redis()
    from ..redis._connection import redis_target
    from ..redis._job_worker import Worker

    config = load_config(config_path)
    worker = Worker(url, config, concurrency=concurrency, name=name, fail_open=fail_open, grace=grace, say=_say)

    def stopping() -> None:
        _say(f"stopping: taking nothing new; requests in flight get {grace:g} s, then go back to the queue")
        worker.stop()

    _say(f"{worker.name} on {redis_target(url)}, {worker.concurrency} at once; waiting for jobs")
    aborted = run_until_stopped(worker.run, stopping)
    answered = sum(worker.answered.values())
    per_job = ", ".join(f"{job}: {count:,}" for job, count in sorted(worker.answered.items())) or "none"
    _say(f"{worker.name} answered {answered:,} requests ({per_job})")
    if worker.fatal is not None:
        return 2  # a configuration error (the --redis URL's credentials): retrying will not help
    return 130 if aborted else 0
