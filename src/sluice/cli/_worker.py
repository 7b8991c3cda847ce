"""``sluice worker``: answer the requests of every distributed job running in Redis."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import click

from .._errors import ConfigError
from ._config import load_config
from ._otel import with_otel
from ._signals import run_until_stopped

__all__ = ["checked_redis_url", "run_worker"]

_REDIS_URL_FORMS = "redis://[:PASSWORD@]HOST[:PORT][/DB], rediss://... (TLS) or unix:///PATH/TO/redis.sock[?db=DB]"


def _say(message: str) -> None:
    click.echo(f"sluice worker: {message}", err=True)


def require_redis() -> None:
    """A clear error, not an ImportError, when the [redis] extra is not installed."""
    try:
        import redis  # noqa: F401
    except ImportError:
        raise ConfigError("--redis needs the redis client: pip install 'llm-sluice[redis]'") from None


def checked_redis_url(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A ``--redis`` URL that redis-py can use, checked while the flags are parsed: before
    any file is created or anything is sent. The message never repeats the URL, which may
    hold a password."""
    if value is None:
        return None
    parts = urlsplit(value)
    if parts.scheme not in ("redis", "rediss", "unix"):
        scheme = f"the scheme {parts.scheme + '://'!r}" if parts.scheme else "no scheme"
        raise click.BadParameter(f"not a Redis URL ({scheme}); expected {_REDIS_URL_FORMS}")
    try:
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number in range
    except ValueError:
        raise click.BadParameter(f"the port is not a number from 0 to 65535; expected {_REDIS_URL_FORMS}") from None
    db = parts.path.strip("/") if parts.scheme != "unix" else ""
    if db and not db.isdigit():
        raise click.BadParameter(f"the database {db[:40]!r} is not a number; expected {_REDIS_URL_FORMS}")
    if parts.scheme == "unix" and not parts.path:
        raise click.BadParameter(f"a unix:// URL needs the socket's path; expected {_REDIS_URL_FORMS}")
    return value


def run_worker(
    url: str,
    *,
    config_path: Path | None,
    concurrency: int | None,
    grace: float,
    fail_open: bool,
    name: str | None,
    otel: bool = False,
) -> int:
    """Work until SIGTERM or Ctrl-C (twice: at once); the exit status.

    Redis unreachable (at start or later) is an outage: the worker says so once and keeps
    retrying, so a worker may start before Redis does. Redis refusing the URL's
    credentials is a configuration error: it says so and exits with status 2.
    """
    require_redis()
    from ..redis._connection import redis_target
    from ..redis._job_worker import Worker

    config = with_otel(load_config(config_path), otel)
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
