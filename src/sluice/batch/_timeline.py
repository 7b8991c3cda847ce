"""A batch job's side of its timeline (``sluice report --html``): when each run began, with
its concurrency and budget, and each deployment's limits as they were configured and as
they were learnt from the provider's headers since. The engine itself logs every attempt
and cooldown into the store's timeline (see :mod:`sluice.store._timeline`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..store import SqliteStore

if TYPE_CHECKING:
    from .._config import JobConfig
    from .._engine import Engine
    from .._models import Deployment

__all__ = ["note_limits", "note_run"]


def note_run(store: SqliteStore, config: JobConfig) -> None:
    """A run of the job begins."""
    if store.timeline is not None:
        store.timeline.run_started(concurrency=config.concurrency, budget_usd=config.budget_usd)


def note_limits(store: SqliteStore, engine: Engine) -> None:
    """Each deployment's limits now (written only when they changed since the last note),
    and the attempts buffered meanwhile handed to the writer (a running job's report)."""
    timeline = store.timeline
    if timeline is None:
        return
    for route in engine.router.routes:
        limiter = route.limiter
        window = float(getattr(limiter, "window", route.deployment.window) or 60.0)
        now = (
            _per_minute(getattr(limiter, "requests_limit", None), window),
            _per_minute(getattr(limiter, "tokens_limit", None), window),
            getattr(limiter, "max_in_flight", None),
        )
        timeline.limits(route.deployment, now, learnt=now != configured(route.deployment))
    timeline.flush()


def configured(deployment: Deployment) -> tuple[float | None, float | None, int | None]:
    """A deployment's own limits, per minute."""
    window = deployment.window
    return _per_minute(deployment.rpm, window), _per_minute(deployment.tpm, window), deployment.max_in_flight


def _per_minute(value: object, window: float) -> float | None:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    return float(value) * 60.0 / window
