"""One worker's Engine on the job's shared parts, answering batches of rows from sync code.

Built as ``sluice worker`` builds its engine (:func:`sluice._config.engine_from`): the
limits on Redis (:class:`~sluice.redis.RedisLimits`, the same Lua scripts as ``--redis``:
headers learnt and 429 pauses shared by every worker of the deployment), the budget on
Redis (:class:`~sluice.redis.RedisBudget` named by the job: worst-case holds, so it holds
whatever the worker count), and the job's answers (:mod:`._store`) as its store.

Engines call a batch function from their own threads and have no event loop to lend, so
the engine lives on a loop of its own in a daemon thread, for the worker's life: its
connections, limiter and budget holds outlive a batch, and batches from several threads
run on it at once. Every second the worker notes itself in ``{ns}:rows:{job}:workers``
(host, pid, rows in flight, its engine's counts) for ``sluice report --redis`` to show.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import pickle
import socket
import threading
import time
from collections.abc import Coroutine, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from .._config import engine_from
from .._errors import SluiceError
from .._models import Request, Result, store_key
from ._job import RowJob
from ._rows import RowReader, chat_columns, embedding_columns
from ._store import DirectoryAnswers, RedisAnswers, job_keys

if TYPE_CHECKING:
    from .._embeddings import EmbeddingResult
    from .._engine import Engine

__all__ = ["HEARTBEAT_S", "RowWorker", "shared_worker"]

T = TypeVar("T")

#: How often a worker notes itself; a note older than three of these is a worker gone.
HEARTBEAT_S = 1.0

#: The longest one step of closing waits for what it ends (a heartbeat stuck on a Redis
#: that went away must not hold the worker's way out).
_CLOSE_STEP_S = 5.0

_SHARED: dict[bytes, RowWorker] = {}
_SHARED_LOCK = threading.Lock()


def shared_worker(job: RowJob) -> RowWorker:
    """This process's worker of ``job`` (made on first use): an engine that pickles its
    callable to every task (Dask) reuses one engine per process, not one per partition."""
    identity = pickle.dumps(job)
    with _SHARED_LOCK:
        worker = _SHARED.get(identity)
        if worker is None or worker.closed:
            worker = _SHARED[identity] = RowWorker(job)
        return worker


class RowWorker:
    """Answers batches of rows (blocking) on an engine of the job's shared parts."""

    def __init__(self, job: RowJob) -> None:
        self.job = job
        self.name = f"{socket.gethostname()}:{os.getpid()}:{id(self):x}"
        self.closed = False
        self.in_flight = 0
        self.rows = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run_loop, name="sluice-rows", daemon=True)
        self._thread.start()
        self._parts: list[Any] = []
        self._beat: asyncio.Task[None] | None = None
        try:
            self.engine: Engine = self._call(self._open())
        except BaseException:
            self.close()
            raise

    # -- from the engine's threads ---------------------------------------------------------

    def answer(self, rows: Sequence[dict[str, Any]]) -> dict[str, list[Any]]:
        """The answer columns of ``rows`` (in their order); nothing raises for a row."""
        if not rows:
            return chat_columns([], self.reader.schema) if not self.job.embeddings else embedding_columns([])
        if self.job.embeddings:
            return self._call(self._embed(rows))
        return self._call(self._complete(rows))

    def close(self) -> None:
        """Let what is in flight finish, close the engine and the connections, end the loop."""
        if self.closed:
            return
        self.closed = True
        if self._thread.is_alive():
            with contextlib.suppress(Exception):  # best effort: leases and holds expire on their own
                asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(timeout=60)
            with contextlib.suppress(RuntimeError):  # the loop already closed itself
                self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)

    def _run_loop(self) -> None:
        """The loop's thread: runs it until :meth:`close` stops it, then ends whatever is
        still pending on it (as :func:`asyncio.run` does) and closes it, so no task, socket
        or session is left for the garbage collector to find half-open, whatever the way
        :meth:`_close` went."""
        loop = self._loop
        try:
            loop.run_forever()
        finally:
            try:
                pending = asyncio.all_tasks(loop)
                for task in pending:
                    task.cancel()
                if pending:
                    loop.run_until_complete(asyncio.wait(pending, timeout=_CLOSE_STEP_S))
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                loop.close()

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        future: concurrent.futures.Future[T] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return future.result()

    # -- on the worker's loop ----------------------------------------------------------------

    async def _open(self) -> Engine:
        from ..redis import RedisBudget, RedisLimits

        job = self.job
        config = job.job_config()
        limits = RedisLimits(job.redis, namespace=job.namespace)
        self._parts.append(limits)
        options: dict[str, Any] = {"limiter_factory": limits.limiter_factory}
        if config.budget_usd is not None:
            budget = RedisBudget(job.redis, f"rows:{job.job}", config.budget_usd, namespace=job.namespace)
            self._parts.append(budget)
            options["shared_budget"] = budget
        if job.store == "redis":
            self.store: RedisAnswers | DirectoryAnswers = RedisAnswers(
                job.redis, job.job, namespace=job.namespace, ttl_seconds=job.ttl_seconds
            )
        else:
            self.store = DirectoryAnswers(
                job.store, job.redis, job.job, namespace=job.namespace, ttl_seconds=job.ttl_seconds
            )
        self._parts.append(self.store)
        engine = engine_from(config, budget_usd=None, store=self.store, on_result=self._answered, **options)
        await engine.start()
        self.reader = RowReader(job, config.model)
        self._beat = asyncio.get_running_loop().create_task(self._heartbeat(engine))
        return engine

    async def _complete(self, rows: Sequence[dict[str, Any]]) -> dict[str, list[Any]]:
        asked = [self.reader.request(row, i) for i, row in enumerate(rows)]
        keys = [store_key(r) for r in asked if isinstance(r, Request)]
        await self.store.prefetch(keys)
        self.in_flight += len(rows)  # down again as each row's result is emitted (_answered)
        try:
            results = await self.engine.run(asked)
        finally:
            self.store.forget(keys)
        await self._note_refused(rows, results)
        return chat_columns(_in_order(results, rows), self.reader.schema)

    async def _note_refused(self, rows: Sequence[dict[str, Any]], results: list[Result]) -> None:
        """Rows that could not be asked, counted with the job's failures: stored under their
        content (a rerun of the same bad row moves no count), as nothing else stores them."""
        for row, result in zip(rows, results, strict=True):
            if result.request is None and result.error is not None:
                content = json.dumps(row, sort_keys=True, default=str)
                await self.store.put("row\x1f" + content, result)

    async def _embed(self, rows: Sequence[dict[str, Any]]) -> dict[str, list[Any]]:
        texts = [self.reader.text(row, i) for i, row in enumerate(rows)]
        wanted = [(i, t) for i, t in enumerate(texts) if isinstance(t, str)]
        out: list[EmbeddingResult | SluiceError | None] = [t if isinstance(t, SluiceError) else None for t in texts]
        model = self.reader.model
        if wanted and model is None:
            raise SluiceError("Embeddings: give model= (the embeddings model)")
        self.in_flight += len(wanted)
        params = {"dimensions": self.job.dimensions} if self.job.dimensions is not None else None
        source = [t for _, t in wanted]
        async for result in self.engine.embed_map(source, model=model or "", params=params, ordered=True):
            out[wanted[result.index][0]] = result
            self._answered(None)  # a vector is no Result: the engine's on_result does not see it
        return embedding_columns([r if r is not None else SluiceError("not embedded") for r in out])

    def _answered(self, result: Result | None) -> None:
        """Each row's result as the engine emits it: rows under way go down as they end."""
        self.in_flight -= 1
        self.rows += 1

    async def _heartbeat(self, engine: Engine) -> None:
        client = self.store.connection.client
        key = job_keys(self.job.namespace, self.job.job)["workers"]
        host, pid = socket.gethostname(), os.getpid()
        while True:
            stats = engine.stats
            note = {
                "host": host,
                "pid": pid,
                "in_flight": self.in_flight,
                "rows": self.rows,
                "succeeded": stats.succeeded,
                "failed": stats.failed,
                "cached": stats.cached,
                "attempts": stats.attempts,
                "rate_limited": stats.rate_limited,
                "cost_usd": stats.total_cost_usd,
                "at": time.time(),
            }
            with contextlib.suppress(Exception):  # a note missed is a worker shown late, nothing more
                async with client.pipeline(transaction=False) as pipe:
                    pipe.hset(key, self.name, json.dumps(note))
                    pipe.expire(key, self.job.ttl_seconds)
                    await pipe.execute()
            await asyncio.sleep(HEARTBEAT_S)

    async def _close(self) -> None:
        if self._beat is not None:
            self._beat.cancel()
            await asyncio.wait({self._beat}, timeout=_CLOSE_STEP_S)
        engine = getattr(self, "engine", None)
        if engine is not None:
            with contextlib.suppress(Exception):
                await engine.close()
        if getattr(self, "store", None) is not None:
            with contextlib.suppress(Exception):
                client = self.store.connection.client
                await client.hdel(job_keys(self.job.namespace, self.job.job)["workers"], self.name)
        for part in reversed(self._parts):
            with contextlib.suppress(Exception):
                await (part.aclose() if hasattr(part, "aclose") else part.close())
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:  # what the parts left running (their listeners): ended, not dropped
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=_CLOSE_STEP_S)


def _in_order(results: list[Result], rows: Sequence[Any]) -> list[Result]:
    assert len(results) == len(rows), "the engine answers every row once"
    return results
