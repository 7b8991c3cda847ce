"""The engine at work for a batch job: built from the job's config, its progress ticking,
its output flushed, each deployment's state noted for ``sluice report``, and the check
each written result goes through (a job whose first requests all fail the same way
stops early). Shared by the chat job and the embeddings job."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Callable

from .._config import engine_from
from .._engine import Engine
from .._errors import SluiceError
from .._models import Result
from ..store import SqliteStore
from ..tiers import batch_report, close_tiers
from ._job import FailFast, JobProgress, JobSpec
from ._output import JobOutput
from ._timeline import note_limits

__all__ = ["engine_for", "fold_deployments", "note_deployments", "running"]


def engine_for(
    spec: JobSpec, progress: JobProgress, store: SqliteStore, *, on_ended: Callable[[int], None] | None = None
) -> Engine:
    """The job's engine: its config's deployments, limits and budget (which counts what
    earlier runs spent). ``on_ended``: the batch tier parks lines (``BatchSettings.on_ended``)."""
    config = spec.config
    if config.tier == "auto":  # the deadline plan counts what is left of the whole job
        config = dataclasses.replace(config, batch=dataclasses.replace(config.batch, remaining=lambda: progress.left))
    if on_ended is not None:
        config = dataclasses.replace(config, batch=dataclasses.replace(config.batch, on_ended=on_ended))
    engine = engine_from(config, store=store, retry_failed=spec.retry_failed, grace=spec.grace)
    progress.engine = engine
    if engine.spending.budget is not None:  # the budget is the job's, over all its runs
        engine.spending.budget.add_spent(progress.spent_before)
    if progress.stopping:
        engine.stop()
    return engine


@contextlib.asynccontextmanager
async def running(
    engine: Engine,
    store: SqliteStore,
    output: JobOutput,
    progress: JobProgress,
    on_tick: Callable[[], None],
) -> AsyncIterator[Callable[[Result], None]]:
    """The engine at work for a job: progress ticking and the output flushed meanwhile, the
    disks watched for room for the answers in flight (the output's ``room``); afterwards
    the output closed, the store's failure (if any) noted, each deployment's state saved
    for ``sluice report``. Yields the check each written result goes through (a job whose
    first requests all fail the same way stops early)."""
    fail_fast = FailFast(progress.total)
    room = output.room
    checked = progress.written

    def check_room() -> None:
        nonlocal checked
        if room is None or progress.stopping:
            return
        short = room.short(progress.written, progress.written - checked)
        checked = progress.written
        if short is not None:
            progress.disk_low = short
            progress.stop()

    def watch(result: Result) -> None:
        verdict = fail_fast.observe(result)
        if verdict is not None and progress.fatal is None:
            progress.fatal = verdict
            progress.stop()

    def note() -> None:
        note_deployments(store, engine, progress.done)
        note_limits(store, engine)
        # for the live line
        progress.batches, progress.answered_twice = batch_report(engine.deployments, progress.answered_sync or ())

    check_room()  # before anything is sent
    ticker = asyncio.get_running_loop().create_task(_tick(output, on_tick, note, check_room))
    try:
        try:
            async with engine:
                note_limits(store, engine)  # as configured, before anything is learnt
                yield watch
        finally:
            progress.batches, progress.answered_twice = batch_report(engine.deployments, progress.answered_sync or ())
            await close_tiers(engine.deployments)  # polling stops; the provider's batches run on
    finally:
        ticker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ticker
        output.close()
        progress.deployments = engine.deployment_status()  # while the loop runs: cooldowns still count
        if engine.store_error is not None:
            progress.store_error = engine.store_error.message
        else:
            note_deployments(store, engine, progress.done)
            note_limits(store, engine)
        on_tick()


def note_deployments(store: SqliteStore, engine: Engine, written: int) -> None:
    """Each deployment's state this run (cooling down, answered, failed), and the records
    written so far, for `sluice report` on a running or interrupted job."""
    rows = [dataclasses.asdict(status) for status in engine.deployment_status()]
    cache = engine.attempts.caching
    planned = {"prompt_cache": cache.summary(groups=50)} if cache is not None and cache.total.requests else {}
    with contextlib.suppress(SluiceError):
        store.set_meta_soon(deployments=rows, deployments_at=time.time(), written=written, **planned)


def fold_deployments(earlier: object, last_run: object) -> dict[str, dict[str, int]]:
    """Answers and failed attempts per deployment over every run before this one: the
    totals so far plus the last run's rows (which `_note_deployments` wrote)."""
    totals: dict[str, dict[str, int]] = {}
    if isinstance(earlier, dict):
        for label, counts in earlier.items():
            if isinstance(counts, dict):
                totals[str(label)] = {k: int(counts.get(k) or 0) for k in ("answered", "failed")}
    for row in last_run if isinstance(last_run, list) else ():
        if isinstance(row, dict) and row.get("deployment") is not None:
            counts = totals.setdefault(str(row["deployment"]), {"answered": 0, "failed": 0})
            for k in ("answered", "failed"):
                counts[k] += int(row.get(k) or 0)
    return totals


async def _tick(
    output: JobOutput, on_tick: Callable[[], None], note: Callable[[], None], check_room: Callable[[], None]
) -> None:
    ticks = 0
    while True:
        await asyncio.sleep(0.25)
        output.flush()
        check_room()
        on_tick()
        ticks += 1
        if ticks % 8 == 0:  # every 2 s: what `sluice report` shows of a running job
            note()
