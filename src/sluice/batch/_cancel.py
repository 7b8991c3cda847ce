"""``sluice cancel``: cancel the provider batches of a ``--tier batch`` (or ``auto``) job.

The job must not be running (it would submit the cancelled lines again). Each batch its
state knows of and that has not ended is cancelled at the provider; what the batches had
finished is kept there, so the next run of the job collects it and sends only the rest.
"""

from __future__ import annotations

from pathlib import Path

from .._config import JobConfig
from .._models import BATCH_SUFFIX, Deployment
from ..store import SqliteStore
from ..tiers import BatchSettings, BatchTier
from ._runner import exclusive

__all__ = ["cancel_job_batches"]


async def cancel_job_batches(state: Path, config: JobConfig) -> list[tuple[str, str, str]]:
    """(deployment, batch id, status) of each batch of the job, after cancelling the open ones."""
    cancelled: list[tuple[str, str, str]] = []
    with exclusive(state):  # refused while the job runs
        store = SqliteStore(state)
        try:
            labels = sorted({chunk.deployment for chunk in store.open_chunks()})
            for label in labels:
                tier = BatchTier(_deployment(label, config), store, BatchSettings())  # journalled by the real label
                try:
                    for batch_id, status in await tier.cancel_open():
                        cancelled.append((label, batch_id, status))
                finally:
                    await tier.aclose()
        finally:
            store.close()
    return cancelled


def _deployment(label: str, config: JobConfig) -> Deployment:
    """The deployment a journalled label names: the configured one, else the model as the
    job served it (``--model``'s, with the job's defaults)."""
    real = label.removesuffix(BATCH_SUFFIX)  # (labels are the real deployment's; kept safe)
    for d in config.deployments:
        if d.label == real:
            return d
    return Deployment(real, **config.defaults)
