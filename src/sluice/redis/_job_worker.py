"""A worker of distributed batch jobs: joins every running job, answers its requests
through an Engine with shared limits and the job's shared budget, and sends the answers
back. ``sluice worker`` runs one; ``sluice run --redis`` runs one inside the coordinator.

What a worker promises (see :mod:`._jobs` for the keys):

* a request already answered (the job's done-set) is not sent again;
* an answer is recorded in one transaction with the end of its entry, so a worker killed
  at any moment loses at most the requests it had in flight, which another worker claims
  (and may send a second time: duplicates are bounded by the dead worker's concurrency);
* a failure that may be this worker's own (its key, its connection, the server's state)
  is given back for another delivery; after ``max_deliveries`` the request becomes a
  dead letter, an error record with the last error;
* Redis away: it stops taking work, says so, retries; answers in hand wait to be sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from redis.exceptions import AuthenticationError, AuthorizationError, RedisError, ResponseError

from .. import _json
from .._config import engine_from
from .._engine import Engine
from .._errors import CancelledError, SluiceError
from .._models import Priority, Result
from .._records import error_record
from ..batch._inputs import InputItem
from ..batch._output import KEPT_KINDS, output_record
from ._job_entries import dead_letter, defaults_from_shared, deployment_from_shared, request_from_fields
from ._jobs import (
    ABANDONED_AFTER_S,
    UNREACHABLE,
    Delivery,
    JobQueue,
    JobSettings,
    WorkerRegistry,
    connect,
    jobs_channel,
    running_jobs,
)

if TYPE_CHECKING:
    from .._config import JobConfig

__all__ = ["Worker", "default_worker_name"]

T = TypeVar("T")

#: Failures that are final wherever the request runs: record them, do not give them back.
#: ``invalid_output`` too: its re-asks were made (and billed) by this delivery; another would
#: pay for them again (a plain rerun of the job asks it again).
_FINAL_KINDS = KEPT_KINDS | {
    "budget_exhausted",
    "invalid_request",
    "invalid_input",
    "exceeds_capacity",
    "invalid_output",
}
#: A job Redis no longer knows for this long is left (its coordinator is gone too).
_FORGOTTEN_AFTER = 60.0
_HEARTBEAT_EVERY = 3.0
_HEARTBEAT_TTL = 10.0
#: How long a worker that holds its fair share of a job waits before it looks again.
_AT_SHARE_WAIT = 0.05
#: Past a stop's grace, how long a Redis call is still retried before it is given up (the
#: entry then stays pending in Redis, for another worker or the rerun to claim).
STOP_SLACK_S = 5.0


def default_worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


#: Seconds each step of a worker's way out (its helpers' ends, leaving the registry, closing) may take.
_WAY_OUT_S = 2.0


class Worker:
    """Answers requests of running jobs until stopped (or, with ``only_job``, until that
    job is finished)."""

    def __init__(
        self,
        url: str,
        config: JobConfig,
        *,
        concurrency: int | None = None,
        name: str | None = None,
        namespace: str = "sluice",
        only_job: str | None = None,
        fail_open: bool = False,
        grace: float | None = 20.0,
        say: Callable[[str], None] = lambda message: None,
    ) -> None:
        self.url = url
        self.config = config
        self.concurrency = concurrency or config.concurrency
        self.name = name or default_worker_name()
        self.namespace = namespace
        self.only_job = only_job
        self.fail_open = fail_open
        self.grace = grace
        self.say = say
        self.client = connect(url)
        #: Answers (and dead letters) this worker recorded, per job.
        self.answered: dict[str, int] = {}
        #: The engine of the job it works on most recently (for progress and summaries).
        self.engine: Engine | None = None
        self._busy = 0
        self._room = asyncio.Event()
        self._room.set()
        self._stopping = asyncio.Event()
        self._stopped_at: float | None = None
        #: Set when a job is announced (or the worker stops): look for jobs now, not in a second.
        self._wake = asyncio.Event()
        self._redis_problem: str | None = None
        self._failures = 0
        #: The engine calls in flight (cut off when a stop's grace period ends).
        self._calls: set[asyncio.Future[Result]] = set()
        #: Why this worker stopped by itself (Redis refused its credentials); None otherwise.
        self.fatal: str | None = None
        #: Jobs this worker cannot serve (its config lacks a key they need): not joined again.
        self._refused: set[str] = set()

    # -- life ------------------------------------------------------------------------------

    def stop(self) -> None:
        """Take nothing new; in-flight requests get ``grace`` seconds, then are given back.
        Redis calls still waiting (Redis is down) are given up ``STOP_SLACK_S`` after that."""
        if self._stopped_at is None:
            self._stopped_at = time.monotonic()
        self._stopping.set()
        self._wake.set()

    def _past_stop(self) -> bool:
        """A stop's grace and slack are over: Redis calls are no longer retried."""
        stopped = self._stopped_at
        return stopped is not None and time.monotonic() > stopped + (self.grace or 0.0) + STOP_SLACK_S

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    async def run(self) -> None:
        jobs: dict[str, asyncio.Task[None]] = {}
        loop = asyncio.get_running_loop()
        beat = loop.create_task(self._heartbeat())
        listener = loop.create_task(self._listen_for_jobs()) if self.only_job is None else None
        try:
            while not self.stopping:
                if self.only_job is not None:
                    ids = [self.only_job]  # no Redis call: says nothing about whether it is back
                else:
                    try:
                        ids = await running_jobs(self.client, self.namespace)
                        self._up()
                    except UNREACHABLE as exc:
                        self._down(exc)
                        ids = []
                for job_id in ids:
                    if job_id in self._refused:
                        continue
                    if job_id not in jobs or jobs[job_id].done():
                        if job_id in jobs and self.only_job is not None:
                            return  # its one job is over
                        if self.only_job is None and await self._abandoned(job_id):
                            continue
                        jobs[job_id] = asyncio.get_running_loop().create_task(self._work_on(job_id))
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), 1.0)
                self._wake.clear()
        finally:
            self._stopping.set()
            if jobs:
                await asyncio.gather(*jobs.values(), return_exceptions=True)
            # Each step of the way out is bounded: a Redis call that a refusal or an outage
            # left half done must not hold the stop (a worker refused by Redis was once seen
            # still running 30 s after it said it was stopping).
            helpers = [task for task in (beat, listener) if task is not None]
            for task in helpers:
                task.cancel()
            if helpers:
                await asyncio.wait(helpers, timeout=_WAY_OUT_S)
            with contextlib.suppress(*UNREACHABLE):
                await asyncio.wait_for(WorkerRegistry(self.client, self.namespace).leave(self.name), _WAY_OUT_S)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.client.aclose(), _WAY_OUT_S)

    async def _listen_for_jobs(self) -> None:
        """Wake the job loop when a coordinator announces a job (the loop still looks every
        second, so a lost subscription only makes joining slower)."""
        while True:
            pubsub = self.client.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(jobs_channel(self.namespace))
                while True:
                    if await pubsub.get_message(timeout=None) is not None:
                        self._wake.set()
            except (RedisError, OSError):  # UNREACHABLE's ConnectionError and TimeoutError are RedisErrors
                await asyncio.sleep(self._backoff())  # _down() is said by the job loop's own calls
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()  # type: ignore[no-untyped-call,unused-ignore]  # typed from redis 8.2

    async def _heartbeat(self) -> None:
        registry = WorkerRegistry(self.client, self.namespace)
        while True:
            try:
                await registry.beat(self.name, self.concurrency, _HEARTBEAT_TTL)
                self._up()
            except UNREACHABLE as exc:
                self._down(exc)
            await asyncio.sleep(_HEARTBEAT_EVERY)

    async def _abandoned(self, job_id: str) -> bool:
        """Whether ``job_id``'s coordinator has been gone so long that the job is dropped
        (see ``ABANDONED_AFTER_S``): then it is taken off the running jobs, and not joined."""
        try:
            dropped = await JobQueue(self.client, job_id, self.namespace).abandon_if_orphaned()
        except UNREACHABLE as exc:
            self._down(exc)
            return True  # not now; the next round asks again
        if dropped:
            self.say(
                f"job {job_id}: its coordinator has not been heard from for {ABANDONED_AFTER_S // 60} min; "
                "taken off the running jobs (rerun its sluice run to go on)"
            )
        return dropped

    def _down(self, exc: BaseException) -> None:
        from ._connection import redis_target

        if isinstance(exc, (AuthenticationError, AuthorizationError)):
            # Not an outage: waiting will not fix a wrong password; the operator must.
            if self.fatal is None:
                self.fatal = (
                    f"Redis at {redis_target(self.url)} refused this worker's credentials ({type(exc).__name__}); "
                    "check the user and password of the --redis URL; stopping"
                )
                self.say(self.fatal)
            self.stop()
            return
        self._failures += 1
        if self._redis_problem is None:
            self._redis_problem = (
                f"Redis at {redis_target(self.url)} cannot be reached ({type(exc).__name__}); "
                "taking no work until it is back, retrying"
            )
            self.say(self._redis_problem)

    def _up(self) -> None:
        if self._redis_problem is not None:
            self._redis_problem = None
            self._failures = 0
            self.say("Redis is back; taking work again")

    def _backoff(self) -> float:
        return float(min(2.0, 0.05 * 2 ** min(self._failures, 6)))

    async def _until_done(self, call: Callable[[], Awaitable[T]]) -> T | None:
        """Run a Redis call until Redis takes it; None once a stop's grace and slack are
        over (whenever the call began: one begun before the stop must not hold it up)."""
        while True:
            try:
                result = await call()
            except UNREACHABLE as exc:
                self._down(exc)
                if self._past_stop():
                    return None
                await asyncio.sleep(self._backoff())
                continue
            self._up()
            return result

    # -- one job ---------------------------------------------------------------------------

    async def _work_on(self, job_id: str) -> None:
        queue = JobQueue(connect(self.url), job_id, self.namespace)
        shared: list[Any] = []
        try:
            settings = await self._until_done(queue.settings)
            if settings is None:
                return
            try:
                engine, shared = self._engine_for(job_id, settings)
                self.engine = engine
                self.say(f"joined job {job_id} ({settings.name})")
                await self._run_engine(queue, settings, engine)
            except SluiceError as exc:  # this machine cannot serve it (a key missing...): others may
                self._refused.add(job_id)
                self.say(f"cannot work on job {job_id}: {exc.message}; leaving it to other workers")
                return
            self.say(f"left job {job_id}: {self.answered.get(job_id, 0):,} answered here")
        finally:
            for part in shared:
                with contextlib.suppress(Exception):
                    await part.close()
            with contextlib.suppress(Exception):
                await queue.client.aclose()

    async def _run_engine(self, queue: JobQueue, settings: JobSettings, engine: Engine) -> None:
        """Read, answer and touch until the job is over or this worker stops; then what is
        in flight gets the grace period and the rest goes back."""
        held: dict[str, Delivery] = {}
        handlers: set[asyncio.Task[None]] = set()
        loop = asyncio.get_running_loop()
        async with engine:
            reader = loop.create_task(self._read(queue, settings, engine, held, handlers))
            toucher = loop.create_task(self._touch(queue, settings, held))
            cut: asyncio.TimerHandle | None = None
            try:
                await self._job_over(queue)
            finally:
                engine.stop(grace=self.grace)
                # The engine's grace covers its batch runs, not complete() calls: after
                # the grace, the requests still at the provider are cut off here and go back.
                if self.grace is not None and self.stopping:
                    cut = loop.call_later(self.grace, self._cut_off)
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reader
                if handlers:
                    await asyncio.gather(*handlers, return_exceptions=True)
                if cut is not None:
                    cut.cancel()
                toucher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await toucher

    def _cut_off(self) -> None:
        for call in list(self._calls):
            call.cancel()

    async def _job_over(self, queue: JobQueue) -> None:
        """Until this worker stops or the job is finished. A job Redis forgot (restarted
        without its data) is waited for a while: its coordinator registers it again."""
        missing_since: float | None = None
        while not self.stopping:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), 1.0)
            try:
                status = await queue.status()
            except UNREACHABLE as exc:
                self._down(exc)
                continue
            if status in ("finished", "abandoned"):
                return
            if status == "running" and self.only_job is None and await self._abandoned(queue.job_id):
                return
            if status is None and self.only_job is None:
                missing_since = missing_since or time.monotonic()
                if time.monotonic() - missing_since > _FORGOTTEN_AFTER:
                    return
            else:
                missing_since = None

    def _engine_for(self, job_id: str, settings: JobSettings) -> tuple[Engine, list[Any]]:
        """The worker's own deployments (keys, base URLs), plus the limits the coordinator
        gave for models this worker's config does not name; limits shared through Redis,
        the job's budget shared by all its workers."""
        config = self.config
        own = {d.model for d in config.deployments} | {d.label for d in config.deployments}
        deployments = list(config.deployments)
        deployments += [deployment_from_shared(d) for d in settings.deployments if d.get("model") not in own]
        from . import RedisBudget, RedisLimits

        limits = RedisLimits(self.url, namespace=self.namespace, fail_open=self.fail_open)
        shared: list[Any] = [limits]
        options: dict[str, Any] = {"limiter_factory": limits.limiter_factory}
        if settings.budget_usd is not None:
            # A joiner: only the coordinator makes the budget, so a Redis that lost its data
            # admits nothing until the coordinator has counted again what the job spent.
            name = settings.budget_name or f"job:{job_id}"
            budget = RedisBudget(self.url, name, settings.budget_usd, namespace=self.namespace, create=False)
            shared.append(budget)
            options["shared_budget"] = budget
        engine = engine_from(
            config,
            deployments=deployments,
            concurrency=self.concurrency,
            budget_usd=None,  # the job's budget is the shared one
            allow_unpriced=settings.allow_unpriced or config.allow_unpriced,
            defaults=config.defaults or defaults_from_shared(settings.defaults),
            grace=self.grace,
            max_reasks=settings.max_reasks,
            **options,
        )
        return engine, shared

    async def _reserve(self) -> int:
        """Wait for room; reserve all of it (the caller gives back what it does not use)."""
        while self._busy >= self.concurrency:
            self._room.clear()
            await self._room.wait()
        n = self.concurrency - self._busy
        self._busy += n
        return n

    def _release(self, n: int = 1) -> None:
        self._busy -= n
        self._room.set()

    async def _read(
        self,
        queue: JobQueue,
        settings: JobSettings,
        engine: Engine,
        held: dict[str, Delivery],
        handlers: set[asyncio.Task[None]],
    ) -> None:
        min_idle_ms = int(settings.claim_after * 1000)
        claim_every = min(1.0, settings.claim_after / 4)
        next_claim = 0.0
        lost = False
        loop = asyncio.get_running_loop()
        while not self.stopping:
            n = await self._reserve()
            got: list[Delivery] = []
            at_share = False
            try:
                if loop.time() >= next_claim:
                    next_claim = loop.time() + claim_every
                    got = await queue.claim(self.name, min(n, 100), min_idle_ms)
                if not got:
                    allowed = await queue.fair_share() - len(held)
                    at_share = allowed <= 0
                    if not at_share:
                        got = await queue.take(self.name, min(n, 100, allowed), 500)
                self._up()
                lost = False
            except UNREACHABLE as exc:
                self._down(exc)
                await asyncio.sleep(self._backoff())
                continue
            except ResponseError as exc:  # NOGROUP: Redis lost the job; its coordinator makes it again
                if not lost and "UNBLOCKED" not in str(exc):  # UNBLOCKED: the job just finished
                    self.say(f"job {queue.job_id}: {exc}; waiting for its coordinator to make it again")
                lost = True
                await asyncio.sleep(1.0)
                continue
            finally:
                self._release(n - len(got))  # the room not used (all of it on a failure)
            if at_share:  # holding its share: the others take the rest; look again soon
                await asyncio.sleep(_AT_SHARE_WAIT)
                continue
            for delivery in got:
                held[delivery.entry_id] = delivery
                task = loop.create_task(self._handle(queue, settings, engine, delivery, held))
                handlers.add(task)
                task.add_done_callback(handlers.discard)

    async def _touch(self, queue: JobQueue, settings: JobSettings, held: dict[str, Delivery]) -> None:
        every = max(0.2, settings.claim_after / 4)
        while True:
            await asyncio.sleep(every)
            try:
                await queue.touch(self.name, list(held))
                self._up()
            except UNREACHABLE as exc:
                self._down(exc)

    async def _handle(
        self, queue: JobQueue, settings: JobSettings, engine: Engine, delivery: Delivery, held: dict[str, Delivery]
    ) -> None:
        try:
            await self._handle_one(queue, settings, engine, delivery)
        except ResponseError as exc:  # the job's entry is gone (Redis lost it): its coordinator feeds it again
            self.say(f"job {queue.job_id}, line {delivery.line}: {exc}")
        finally:
            held.pop(delivery.entry_id, None)
            self._release()

    async def _handle_one(self, queue: JobQueue, settings: JobSettings, engine: Engine, delivery: Delivery) -> None:
        fields = delivery.fields
        request = request_from_fields(fields[b"body"])
        done = await self._until_done(lambda: queue.is_done(delivery.line))
        if done is None:
            return  # stopped while Redis is away: left pending, for whoever claims it next
        if done:
            await self._until_done(lambda: queue.skip(delivery))
            return
        dead = delivery.times > settings.max_deliveries
        if dead:  # final, whatever its last error was
            last = await self._until_done(lambda: queue.last_error(delivery.line))
            result = Result(request, error=dead_letter(delivery.times - 1, last))
        else:
            call = asyncio.ensure_future(engine.complete(request, priority=Priority.BATCH))
            self._calls.add(call)
            try:
                result = await call
            except SluiceError as exc:  # refused before sending (an invalid request)
                result = Result(request, error=exc)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if not call.cancelled() or (task is not None and task.cancelling()):
                    raise
                # cut off by _cut_off after the grace period: given back below
                result = Result(request, error=CancelledError("stopped after the grace period; given back"))
            finally:
                self._calls.discard(call)
        error = result.error
        if not dead and (isinstance(error, CancelledError) or (error is not None and error.kind not in _FINAL_KINDS)):
            note = None if isinstance(error, CancelledError) else error_record(error)
            await self._until_done(lambda: queue.give_back(self.name, delivery, note))
            return
        custom_id = fields.get(b"cid")
        item = InputItem(delivery.line, request=request, custom_id=custom_id.decode() if custom_id else None)
        record = output_record(item, result, request)
        payload: dict[str, str | int] = {
            "line": delivery.line,
            "key": fields[b"key"].decode(),
            "worker": self.name,
            "out": _json.dumps_text(record),
            "request_id": result.request_id or "",
        }
        # Held until Redis takes it; a worker stopped meanwhile leaves the entry pending,
        # for another worker to claim (and perhaps send again).
        if await self._until_done(lambda: queue.answer(delivery, payload)) is not None:
            self.answered[queue.job_id] = self.answered.get(queue.job_id, 0) + 1
