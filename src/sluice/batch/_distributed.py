"""The coordinator of a distributed job (``sluice run --redis``): what it does instead of
running the requests itself.

It registers the job in Redis, reads the input lazily and feeds the request stream as it
drains (at most a few times the workers' total concurrency sits there, so a 10M-line file
never does), and writes what comes back exactly as a local run does: each result durable
in the SQLite state before its output line is written, then acknowledged in Redis. Lines
the state or the output already answers are never fed. By default the coordinator is a
worker too, so ``sluice run --redis`` alone finishes the job.

A coordinator killed and rerun finds its job by the state file's identity: results that
arrived meanwhile are waiting in Redis, requests still queued are not fed again. Redis
away: it stops feeding, says so, retries; nothing answered is lost (answers wait in Redis
until written).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import json
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from redis.exceptions import AuthenticationError, AuthorizationError, ResponseError

from .._errors import ConfigError, InvalidInputError, SluiceError, StoreError
from .._models import Deployment, Request, Result, store_key
from .._records import result_from_record
from .._spending import Spending
from .._stats import Stats
from ..redis._job_entries import request_fields, shared_defaults, shared_deployment
from ..redis._job_worker import STOP_SLACK_S, Worker
from ..redis._jobs import UNREACHABLE, JobQueue, JobSettings, WorkerRegistry, connect, job_id_for
from ..store import SqliteStore
from ._inputs import EMBEDDING_IN_CHAT_JOB, InputItem, embeds, read_inputs, request_of
from ._job import Distributed, FailFast, JobProgress, JobSpec
from ._output import DoneLines, JobOutput, OutputFile, output_record
from ._running import note_deployments

__all__ = ["coordinate"]

T = TypeVar("T")

#: Entries fed per worker slot: enough that no worker waits, few enough to stay small.
_WINDOW_PER_SLOT = 2
_MIN_WINDOW = 16
#: Lines stay in the done-set this long after their record is written (a worker that
#: claimed a line from one thought dead checks it before sending).
_DONE_KEPT_S = 60.0
#: How often the coordinator reads its pending results again: a read whose reply was lost
#: (Redis went away, or a connection dropped and redis-py's one silent retry read anew)
#: leaves entries pending on this consumer, where no ``>`` read returns them.
_REREAD_EVERY_S = 5.0


async def coordinate(
    spec: JobSpec,
    progress: JobProgress,
    store: SqliteStore,
    done: DoneLines,
    on_tick: Callable[[], None],
    file: OutputFile,
) -> None:
    """Run the job through Redis until every line has its record, or it is stopped."""
    assert spec.distributed is not None
    if embeds(spec.input, spec.inputs):
        raise ConfigError("--redis runs chat jobs; run an embeddings job without --redis")
    started_at = store.meta().get("started_at")
    job_id = job_id_for(socket.gethostname(), str(spec.state.resolve()), started_at)
    progress.worker_stats = Stats()
    coordinator = _Coordinator(spec, spec.distributed, progress, store, done, JobOutput(file, progress), job_id)
    await coordinator.run(on_tick)


def _say(message: str) -> None:
    print(f"sluice: {message}", file=sys.stderr, flush=True)


class _Coordinator:
    def __init__(
        self,
        spec: JobSpec,
        options: Distributed,
        progress: JobProgress,
        store: SqliteStore,
        done: DoneLines,
        output: JobOutput,
        job_id: str,
    ) -> None:
        self.spec = spec
        self.options = options
        self.progress = progress
        self.store = store
        self.done = done
        self.output = output
        self.client = connect(options.url)
        self.queue = JobQueue(self.client, job_id)
        self.registry = WorkerRegistry(self.client)
        #: Lines fed (by this run or an earlier one) whose record is not written yet.
        self.inflight: set[int] = set()
        self.fed_all = False
        #: Redis lost the job (restarted without persistence): feed what is not answered again.
        self.refeed = False
        self.finished = False
        self.settings = JobSettings()
        self.feeder: asyncio.Task[None] | None = None
        self.window = _MIN_WINDOW
        self.worker: Worker | None = None
        self.worker_task: asyncio.Task[None] | None = None
        self._fail_fast = FailFast(progress.total)
        self._forget: collections.deque[tuple[float, int]] = collections.deque()
        self._problem: str | None = None
        self._failures = 0
        self._no_workers_said = False
        #: Under a budget: each fed line's worst case, until its record is written.
        self._worst: dict[int, float] = {}
        #: Worst cases of lines in flight when Redis lost the job (their answers, and what
        #: they cost, may have been lost with it): counted as spent, never forgotten.
        self._lost_worst = 0.0
        self._pricing = Spending(None)

    # -- Redis, retried ------------------------------------------------------------------

    async def _redis(self, call: Callable[[], Awaitable[T]]) -> T:
        """Until Redis takes the call; a stopping job gives up once its grace period (and
        the worker's slack after it) is over, counted from the stop."""
        while True:
            try:
                result = await call()
            except ResponseError as exc:
                # NOGROUP: the stream is gone; UNBLOCKED: it went while we were blocked on it
                # (a flush, an eviction): either way Redis lost the job
                if "NOGROUP" not in str(exc) and "UNBLOCKED" not in str(exc):
                    raise
                await self._lost()
                continue
            except UNREACHABLE as exc:
                from ..redis._connection import redis_target

                if isinstance(exc, (AuthenticationError, AuthorizationError)):  # not an outage
                    raise ConfigError(
                        f"Redis at {redis_target(self.options.url)} refused the credentials of the --redis URL "
                        f"({type(exc).__name__}); check its user and password"
                    ) from None
                self._failures += 1
                if self._problem is None:
                    self._problem = (
                        f"Redis at {redis_target(self.options.url)} cannot be reached ({type(exc).__name__}); "
                        "feeding stopped, retrying (answers wait in Redis)"
                    )
                    _say(self._problem)
                stopped = self.progress.stopped_at
                if stopped is not None and time.monotonic() > stopped + (self.spec.grace or 0.0) + STOP_SLACK_S:
                    raise _GaveUp("Redis stayed away") from None
                await asyncio.sleep(min(2.0, 0.05 * 2 ** min(self._failures, 6)))
                continue
            if self._problem is not None:
                self._problem = None
                self._failures = 0
                _say("Redis is back; the job goes on")
            return result

    # -- the job -----------------------------------------------------------------------

    async def run(self, on_tick: Callable[[], None]) -> None:
        config = self.spec.config
        budget_name = f"job:{self.queue.job_id}"
        self.settings = JobSettings(
            budget_usd=config.budget_usd,
            allow_unpriced=config.allow_unpriced,
            deployments=tuple(shared_deployment(d) for d in config.deployments),
            defaults=shared_defaults(config.defaults),
            claim_after=self.options.claim_after,
            max_deliveries=self.options.max_deliveries,
            name=self.spec.input.name,
            budget_name=budget_name,
            max_reasks=config.max_reasks,
        )
        loop = asyncio.get_running_loop()
        tasks: list[asyncio.Task[Any]] = []
        try:
            await self._register()
            # Requests an earlier run fed (queued, in flight, or answered and waiting).
            earlier = await self._redis(self.queue.lines_in_redis)
            self.inflight.update(line for line in earlier if line not in self.done)
            if self.options.local_worker:
                self.worker = Worker(
                    self.options.url,
                    config,
                    only_job=self.queue.job_id,
                    fail_open=self.options.fail_open,
                    grace=self.spec.grace,
                    say=_say,
                )
                self.worker_task = loop.create_task(self.worker.run())
            tasks.append(loop.create_task(self._tick(on_tick)))
            self.feeder = loop.create_task(self._feed())
            await self._collect()
            if self.fed_all and not self.inflight and not self.progress.stopping:
                self.finished = True
                await self._redis(self.queue.finish)
        except _GaveUp:
            pass
        finally:
            if self.worker is not None:
                self.worker.stop()
            if self.feeder is not None:
                tasks.append(self.feeder)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if self.worker_task is not None:  # the local worker gives back what it holds
                await asyncio.gather(self.worker_task, return_exceptions=True)
            self.progress.not_done += len(self.inflight)
            self.output.close()
            if self.worker is not None and self.worker.engine is not None:
                self.progress.deployments = self.worker.engine.deployment_status()
                note_deployments(self.store, self.worker.engine, self.progress.done)
            on_tick()
            with contextlib.suppress(Exception):
                await self.client.aclose()

    async def _register(self) -> None:
        budget = self.spec.config.budget_usd
        if budget is not None:
            await self._shared_budget(self.settings.budget_name, budget)
        await self._redis(lambda: self.queue.register(self.settings))

    async def _lost(self) -> None:
        """The job is gone from Redis (it restarted without its data): register it again
        and feed again every line not written yet (workers check the done-set first)."""
        _say(
            "Redis no longer knows the job (restarted without persistence?): registering it again and "
            "feeding the lines not answered yet again (answers that were waiting in Redis are lost; "
            "those requests are sent again)"
        )
        self._lost_worst += sum(self._worst.get(line, 0.0) for line in self.inflight)
        await self._register()
        self.refeed = True
        self.fed_all = False
        if self.feeder is not None and self.feeder.done():
            self.feeder = asyncio.get_running_loop().create_task(self._feed())

    async def _shared_budget(self, name: str, usd: float) -> None:
        """The job's budget in Redis: this run's limit, and at least what the state says
        was spent (what workers spent since is already there; requests in flight when Redis
        lost its data count when they settle)."""
        from ..redis import RedisBudget

        budget = RedisBudget(self.options.url, name, usd)
        try:
            # earlier runs, and this run's answers written so far: after Redis lost its data
            # (a re-registration) that is all that counts what was spent; one atomic step, so
            # no worker is granted against the limit before the spending is counted
            known = self.progress.spent_before + self.progress.workers_cost_usd + self._lost_worst
            await self._redis(lambda: budget.set_limit(usd, spent_at_least=known))
        finally:
            await budget.close()

    async def _tick(self, on_tick: Callable[[], None]) -> None:
        ticks = 0
        while True:
            await asyncio.sleep(0.25)
            self.output.flush()
            if self.worker is not None and self.progress.stopping:
                self.worker.stop()
            on_tick()
            ticks += 1
            if ticks % 8 == 1:
                with contextlib.suppress(*UNREACHABLE):
                    await self.queue.coordinator_beat()
                    capacity = await self.registry.capacity()
                    self.window = max(_MIN_WINDOW, _WINDOW_PER_SLOT * capacity)
                    self._say_workers(capacity)
                    if not self.finished and not await self.queue.is_running():
                        await self._lost()
                if self.worker is not None and self.worker.engine is not None:
                    note_deployments(self.store, self.worker.engine, self.progress.done)

    def _say_workers(self, capacity: int) -> None:
        """Without a local worker, say when no worker is there to answer (a job that
        waits must not look hung), and when workers come."""
        if self.worker is not None or (self.fed_all and not self.inflight):
            return
        if capacity == 0 and not self._no_workers_said:
            self._no_workers_said = True
            from ..redis._connection import redis_target

            _say(
                f"waiting for workers: none is connected to Redis at {redis_target(self.options.url)} "
                "(start one with: sluice worker --redis URL)"
            )
        elif capacity > 0 and self._no_workers_said:
            self._no_workers_said = False
            _say(f"workers connected: {capacity} requests at once")

    # -- feeding -----------------------------------------------------------------------

    async def _feed(self) -> None:
        while True:
            refeed, self.refeed = self.refeed, False
            if refeed:
                self.inflight.clear()
            await self._feed_pass()
            if not self.refeed:
                return

    async def _feed_pass(self) -> None:
        spec, progress = self.spec, self.progress
        batch: list[dict[str, str | int]] = []
        room = 0
        for count, item in enumerate(read_inputs(spec.input, spec.inputs)):
            if progress.stopping or self.refeed:
                return
            if count % 256 == 255:
                await asyncio.sleep(0)  # skipping a long done stretch must not starve the rest
            if item.line in self.done or item.line in self.inflight:
                continue
            if item.error is not None and spec.strict:
                progress.strict_error = item.error.message
                break  # the records before it still finish
            if item.own_model is not None:
                progress.note_own_model(item.own_model)
            if item.error is not None or item.embedding is not None or item.request is None:
                error = item.error or InvalidInputError(f"line {item.line}: {EMBEDDING_IN_CHAT_JOB}", line=item.line)
                self._write_here(item, Result(None, error=error))
                continue
            request = request_of(item, spec.cache)
            key = store_key(request)
            stored = self.store.get(key)
            if stored is not None and (stored.ok or (stored.kept and not spec.retry_failed)):
                self._write_here(item, result_from_record(request, stored.record), request)
                continue
            entry: dict[str, str | int] = {"line": item.line, "key": key, "body": request_fields(request)}
            if item.custom_id is not None:
                entry["cid"] = item.custom_id
            batch.append(entry)
            self.inflight.add(item.line)
            if self.spec.config.budget_usd is not None:
                self._worst[item.line] = self._worst_cost(request)
            if len(batch) >= room:
                room = await self._flush(batch)
                if room < 0:
                    return
        await self._flush(batch)
        if progress.strict_error is None and not progress.stopping:
            progress.source_exhausted = True
        self.fed_all = True

    async def _flush(self, batch: list[dict[str, str | int]]) -> int:
        """Feed ``batch`` once the stream has room; the room left after it (-1: stopped)."""
        while True:
            if self.progress.stopping or self.refeed:
                return -1
            outstanding = await self._redis(self.queue.outstanding)
            room = self.window - outstanding
            if room > 0 or not batch:
                break
            await asyncio.sleep(0.05)
        entries = list(batch)
        batch.clear()
        if entries:
            await self._redis(lambda: self.queue.feed(entries))
        return max(0, room - len(entries))

    def _worst_cost(self, request: Request) -> float:
        """The most ``request`` can cost, priced as the coordinator's config would (0.0
        when unknown here: a worker's own price then counts only in Redis)."""
        config = self.spec.config
        try:
            deployment = next(
                (d for d in config.deployments if request.model in (d.model, d.label)), None
            ) or Deployment(request.model, **config.defaults)
            return self._pricing.worst_cost(request, deployment)
        except (SluiceError, TypeError, ValueError):
            return 0.0

    def _write_here(self, item: InputItem, result: Result, sent: Any = None) -> None:
        """A record the coordinator knows without asking anyone (bad input, a stored answer)."""
        if self.output.write(output_record(item, result, sent)):
            self.done.add(item.line)
            self.progress.count(result, sent)
            self._watch(result)

    def _watch(self, result: Result) -> None:
        verdict = self._fail_fast.observe(result)
        if verdict is not None and self.progress.fatal is None:
            self.progress.fatal = verdict
            self.progress.stop()

    # -- collecting --------------------------------------------------------------------

    async def _collect(self) -> None:
        pending = True  # first what an earlier run read and did not acknowledge
        reread_at = time.monotonic() + _REREAD_EVERY_S
        while True:
            if self.fed_all and not self.inflight:
                return
            if time.monotonic() >= reread_at:  # and again now and then
                pending = True
                reread_at = time.monotonic() + _REREAD_EVERY_S
            last = self.progress.stopping and (self.worker_task is None or self.worker_task.done())
            entries = await self._redis(self._reader(pending and not last, 100 if last else 250))
            if last:
                await self._write_results(entries)
                return
            if pending and not entries:
                pending = False
                continue
            await self._write_results(entries)

    def _reader(self, pending: bool, block_ms: int) -> Callable[[], Awaitable[list[tuple[str, dict[bytes, bytes]]]]]:
        return lambda: self.queue.read_results(pending=pending, count=512, block_ms=block_ms)

    async def _write_results(self, entries: list[tuple[str, dict[bytes, bytes]]]) -> None:
        if not entries:
            await self._forget_old([])
            return
        fresh: list[tuple[int, str, dict[str, Any], Result, str]] = []
        for _entry_id, fields in entries:
            line = int(fields[b"line"])
            if line in self.done:  # answered twice (a worker thought dead was not): written once
                continue
            record = json.loads(fields[b"out"])
            request_id = fields.get(b"request_id", b"").decode() or None
            fresh.append(
                (line, fields[b"key"].decode(), record, _result_of(record, request_id), _text(fields, b"worker"))
            )
            self.done.add(line)
        try:
            await asyncio.gather(*(self._persist(key, result) for _, key, _, result, _ in fresh))
        except StoreError as exc:
            for line, *_ in fresh:
                self.done.discard(line)
            self.progress.store_error = exc.message
            self.progress.stop()
            return  # not acknowledged: the answers wait in Redis for the rerun
        now = time.monotonic()
        for line, _key, record, result, worker in fresh:
            if not self.output.write(record):
                continue  # the output failed: the job stops; the answer is in the state
            self.inflight.discard(line)
            self._worst.pop(line, None)
            self._forget.append((now, line))
            self._count(record, result, worker)
        await self._forget_old([entry_id for entry_id, _ in entries])

    async def _forget_old(self, entry_ids: list[str]) -> None:
        cutoff = time.monotonic() - _DONE_KEPT_S
        old: list[int] = []
        while self._forget and self._forget[0][0] < cutoff:
            old.append(self._forget.popleft()[1])
        if entry_ids or old:
            await self._redis(lambda: self.queue.ack_results(entry_ids, old))

    async def _persist(self, key: str, result: Result) -> None:
        """The answer durable in the state (and its cost in the job's charges)."""
        if result.cost_usd:
            intent = await self.store.begin(key, 0.0)
            self.store.settle(intent, result.cost_usd, answered=result.ok)
        await self.store.put(key, result)
        if self.store.error is not None:
            raise self.store.error

    def _count(self, record: Mapping[str, Any], result: Result, worker: str) -> None:
        progress = self.progress
        progress.count(result)
        if "max_tokens_added" in record:
            progress.capped += 1
            if result.finish_reason in ("length", "max_tokens"):
                progress.cut_at_cap += 1
        progress.workers[worker] = progress.workers.get(worker, 0) + 1
        progress.workers_cost_usd += result.cost_usd or 0.0
        stats = progress.worker_stats
        if stats is not None and not result.cached:
            stats.record(result)
            stats.attempts += result.attempts
            stats.retries += max(0, result.attempts - 1)
        self._watch(result)


class _GaveUp(SluiceError):
    """Redis stayed away past a stop's grace: the rest waits in Redis for the rerun."""


def _text(fields: Mapping[bytes, bytes], name: bytes) -> str:
    value = fields.get(name)
    return value.decode() if value else "?"


def _result_of(record: Mapping[str, Any], request_id: str | None) -> Result:
    """The Result an output record describes (for the state file, counts and fail-fast)."""
    stored = {
        "ok": record.get("ok"),
        "text": record.get("text"),
        "error": record.get("error"),
        "usage": record.get("usage"),
        "raw": record.get("response"),
        "attempts": record.get("attempts"),
        "latency_s": record.get("latency_s"),
        "deployment": record.get("deployment"),
        "finish_reason": record.get("finish_reason"),
        "request_id": request_id,
        "cost_usd": record.get("cost_usd"),
        "model": record.get("model"),
    }
    return dataclasses.replace(result_from_record(None, stored), cached=bool(record.get("cached")))
