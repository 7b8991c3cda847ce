"""Files expire: each has an ``expires_at`` (``file_ttl_days`` after it was made, or the
upload's sooner ``expires_after``), and a sweep deletes those whose time is up, row and
content, as OpenAI does, except the input of a batch still at work (it goes once that
batch has ended). A Message Batch's own files go with their batch (``delete``).

The sweep runs at startup, where it also removes the temporary files of uploads a stop
cut off, and then every tenth of the TTL (at most every 10 minutes, at least every second).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from aiohttp import web

from ..core._replicas import REPLICAS
from ._ctx import BATCH_CTX, BatchContext
from ._uploads import UPLOAD_PREFIX

__all__ = ["start_expiry", "stop_expiry", "sweep"]

_log = logging.getLogger("sluice.serve")
_TASK: web.AppKey[asyncio.Task[None]] = web.AppKey("sluice.serve.file_expiry", asyncio.Task)


def sweep(ctx: BatchContext, now: float) -> list[str]:
    """Delete the files whose time is up (not the input of a batch at work); their ids."""
    busy = {batch.get("input_file_id") for _, batch in ctx.db.active()}
    gone = []
    for row in ctx.db.expired(now):
        if row.id in busy:
            continue
        ctx.db.delete_file(row.client, row.id)
        with contextlib.suppress(FileNotFoundError):
            ctx.file_path(row.id).unlink()
        gone.append(row.id)
    return gone


async def start_expiry(app: web.Application) -> None:
    """After the Batch API opened its state: the cut-off uploads removed, the first sweep, the loop."""
    ctx = app[BATCH_CTX]
    if ctx.files_dir.is_dir():
        for left in ctx.files_dir.glob(f"{UPLOAD_PREFIX}*"):
            with contextlib.suppress(FileNotFoundError):
                left.unlink()
    app[_TASK] = asyncio.create_task(_sweep_often(app))


async def stop_expiry(app: web.Application) -> None:
    task = app.get(_TASK)
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _sweep_often(app: web.Application) -> None:
    ctx = app[BATCH_CTX]
    every = max(1.0, min(600.0, ctx.limits.file_ttl_s / 10)) if ctx.limits.file_ttl_s else 600.0
    while True:
        try:
            gone = sweep(ctx, time.time())
            replicas = app.get(REPLICAS)
            if replicas is not None:
                for file_id in gone:
                    await replicas.disown(file_id)
        except Exception:
            _log.exception("sluice serve: cannot delete expired files; retrying")
        await asyncio.sleep(every)
