"""The batches at work in this process: started, resumed at startup, cancelled, stopped.

One place for both of the server's batch APIs (OpenAI's ``/v1/batches`` and Anthropic's
``/v1/messages/batches``), so each runs its batches as the other does. At startup every
batch with work left (validating, in progress, finalizing, cancelling) continues; at
cleanup they stop feeding new lines, what is in flight gets ``grace`` seconds to finish
and be recorded, and the batches stay ``in_progress`` for the next start.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from aiohttp import web

from ..core._keys import BATCH_ENGINE, ENGINE, STATE_DIR, ClientLike
from ..files._ctx import BATCH_CTX, EMBEDDINGS, Caller
from ._run import BatchRun

if TYPE_CHECKING:
    from ..._engine import Engine

__all__ = [
    "DEFAULT_CLIENT",
    "RUNS",
    "Runs",
    "cancel_run",
    "live_copy",
    "resume_batches",
    "start_run",
    "stop_batches",
]

#: The anonymous client's name (no ``[[client]]`` entries, or a bare app in tests).
DEFAULT_CLIENT = "default"


class Runs:
    """The batches at work in this process, by id."""

    def __init__(self, client_named: Callable[[str], ClientLike | None] | None, grace: float) -> None:
        self.client_named = client_named
        self.grace = grace
        self.by_id: dict[str, BatchRun] = {}


RUNS: web.AppKey[Runs] = web.AppKey("sluice.batch_runs", Runs)


async def resume_batches(app: web.Application) -> None:
    ctx = app[BATCH_CTX]
    ctx.open(app[STATE_DIR])
    runs = app[RUNS]
    for owner, batch in ctx.db.active():
        known = runs.client_named(owner) if runs.client_named is not None else ctx.seen.get(owner)
        if known is None and owner == DEFAULT_CLIENT:
            known = Caller()
        if known is not None:
            start_run(app, known, batch)
        elif runs.client_named is not None:  # no longer configured: nobody may pay for it
            run = BatchRun(ctx, _engine_of(app, batch), Caller(owner), batch)
            run.fail("client_removed", f"the client {owner!r} is no longer configured on this server")
        else:
            ctx.parked.setdefault(owner, []).append(functools.partial(_start_for, app, batch))


def _start_for(app: web.Application, batch: dict[str, Any], client: ClientLike) -> None:
    start_run(app, client, batch)


def _engine_of(app: web.Application, batch: Mapping[str, Any]) -> Callable[[], Engine]:
    """Batches of chat requests (in any API's shape) on the Batch-API engine when the
    server has one; embeddings on the engine."""
    if batch.get("endpoint") != EMBEDDINGS and BATCH_ENGINE in app:
        return lambda: app[BATCH_ENGINE]
    return lambda: app[ENGINE]


def start_run(app: web.Application, client: ClientLike, batch: dict[str, Any]) -> BatchRun:
    """Run ``batch`` (saved already) for ``client`` until it ends or the server stops."""
    run = BatchRun(app[BATCH_CTX], _engine_of(app, batch), client, batch)
    runs = app[RUNS].by_id
    runs[run.id] = run
    run.start().add_done_callback(lambda _: runs.pop(run.id, None))
    return run


def live_copy(app: web.Application, batch: dict[str, Any]) -> dict[str, Any]:
    """The running copy of a batch when it is at work here (its counts are fresher)."""
    run = app[RUNS].by_id.get(batch["id"])
    return run.batch if run is not None else batch


def cancel_run(app: web.Application, client: str, batch: dict[str, Any]) -> dict[str, Any] | str:
    """Cancel a batch: nothing new is sent, what is in flight finishes, then it ends as
    ``cancelled``. The batch (its live copy), or the status it has that cannot be cancelled."""
    run = app[RUNS].by_id.get(batch["id"])
    status = (run.batch if run is not None else batch)["status"]
    if status == "cancelling":
        return live_copy(app, batch)
    if status not in ("validating", "in_progress"):
        return str(status)
    if run is None:  # resumed at startup, waiting for its client: it finalizes as cancelled when it starts
        batch.update(status="cancelling", cancelling_at=int(time.time()))
        app[BATCH_CTX].db.save_batch(client, batch)
        return batch
    run.cancel()
    return run.batch


async def stop_batches(app: web.Application) -> None:
    """Stop feeding; give what is in flight ``grace`` seconds to finish and be recorded."""
    runs = app[RUNS]
    tasks = [run.task for run in runs.by_id.values() if run.task is not None]
    for run in runs.by_id.values():
        run.stop()
    if tasks:
        _, late = await asyncio.wait(tasks, timeout=runs.grace)
        for task in late:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*late, return_exceptions=True)
    app[BATCH_CTX].close()
