"""The attempt core: admit -> send -> settle -> learn from a failure -> back off, and again.

Every front end runs its requests through :meth:`Attempts.until_outcome`, the one retry
loop: a chat request (``complete()``, ``map()``), a stream (until its first delta; after
it nothing is retried), an embeddings pack (sending itself). Around the loop:

* :meth:`Attempts.job` makes a :class:`~sluice._job.Job` of a Request: its store key,
  the model its budget lets it use, the groups it may go to (its model's deployments,
  then its fallbacks'), its token estimate and worst case;
* :meth:`Attempts.admit` (``_admission``) takes money, then capacity, then (with a store)
  the durable intent: a :class:`~sluice._slot.Slot`, settled exactly once whatever happens;
* :meth:`Attempts.after_failure` learns from a failed attempt (a 429 pauses the
  deployment, failures cool it, a model that cannot take the request hands it to the
  next of its fallbacks) and says how long to wait, or to give up;
* :meth:`Attempts.finish` makes the Result, :meth:`Attempts.record` makes it durable
  before anyone is told.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar, cast

from ._admission import Admission
from ._arrival import listening
from ._errors import (
    AttemptTimeoutError,
    CancelledError,
    FatalProviderError,
    MovedToSyncError,
    ParkedError,
    ProviderError,
    RateLimitError,
    SluiceError,
    StoreError,
)
from ._fastinit import maker
from ._job import Job
from ._limits import RateLimitSnapshot
from ._models import Request, Result, Timings, Usage
from ._records import result_from_record
from ._retry import RetryPolicy
from ._router import Route, Router, deployment_fault, model_cannot_take
from ._runtime import Runtime
from ._slot import AttemptTimer, Slot, Tally, settle_unsettled, stopped_note
from ._spending import Spending
from ._stats import Stats
from .providers import Reply
from .structured import MAX_REASKS
from .structured._loop import generation_after, reask_cost, until_valid

if TYPE_CHECKING:
    from ._tracing import Tracer
    from .store import AttemptLog, SettlingStore, Store

__all__ = ["Attempts", "Opening", "RetryEvent"]

_log = logging.getLogger("sluice")

_NEVER_SENT = "cancelled while an identical request was in flight; it was never sent"
#: Outcomes never stored: a cancelled job is redone by the rerun, a parked one asked again.
_UNSTORED = (CancelledError, ParkedError)
#: Every job's Result and Timings, made without ``type.__call__``'s keyword dict (see ``_fastinit``).
_make_result, _make_timings = maker(Result), maker(Timings)


class _Answer(Protocol):
    """What an attempt's reply carries for the loop: usage, and what the headers said."""

    @property
    def usage(self) -> Usage: ...

    @property
    def ratelimit(self) -> RateLimitSnapshot | None: ...


_A = TypeVar("_A", bound=_Answer)


class Opening:
    """A send whose answer goes on after it returns (a stream past its first delta). The
    attempt then leaves its slot unsettled, in :attr:`slot`, for the caller to settle when
    the answer ends; nothing is reconciled or learnt from it yet."""

    usage: ClassVar[Usage] = Usage()
    ratelimit: ClassVar[RateLimitSnapshot | None] = None
    slot: Slot | None = None


@dataclass(frozen=True, slots=True)
class RetryEvent:
    """Told to ``on_retry`` before the engine waits and tries again."""

    request: Request
    error: SluiceError
    attempt: int
    delay: float
    deployment: str


class Attempts(Admission):
    """One engine's attempt core (see the module docstring)."""

    def __init__(
        self,
        runtime: Runtime,
        router: Router,
        spending: Spending,
        retry: RetryPolicy,
        stats: Stats,
        store: Store | None,
        *,
        retry_failed: bool = False,
        on_retry: Callable[[RetryEvent], object] | None = None,
        max_reasks: int = MAX_REASKS,
    ) -> None:
        self.runtime = runtime
        self.router = router
        self.spending = spending
        self.retry = retry
        self.stats = stats
        self.store = store
        self.retry_failed = retry_failed
        self.on_retry = on_retry
        #: Re-asks of an answer that does not match its request's schema (see ``structured``).
        self.max_reasks = max_reasks
        #: ``Engine(tracing=...)``'s spans (None: off; each seam below is one test of it).
        self.tracer: Tracer | None = None
        self.timer = AttemptTimer()
        #: The store writes a result and settles its last attempt's intent in one op.
        self.settling = callable(getattr(store, "put_settled", None))  # not isinstance: no sqlite3 import here
        #: Told of every attempt and cooldown, when the store keeps a timeline (``sluice report``).
        self.timeline: AttemptLog | None = getattr(store, "timeline", None)
        self._inflight: dict[str, asyncio.Future[Result]] = {}
        self._worst_of = self.worst  # bound once: every Slot calls it with its job
        self._store_failed = runtime.store_failed  # ...and holds this (a bound method made once, not per Slot)

    # -- jobs ------------------------------------------------------------------------------

    def settle_handed_over(self, tally: Tally) -> None:
        """Settle the intent an answer handed over (``hand_over``): another attempt follows."""
        settle_unsettled(tally, self.store, self.runtime.store_failed)

    # -- a chat request to its Result ---------------------------------------------------------

    def from_store(self, job: Job) -> Result | None:
        """The stored result for this job, emitted, if the store has one worth reusing:
        an answer, or (unless ``retry_failed``) the provider's rejection of the request."""
        if self.store is None or job.key is None:
            return None
        stored = self.store.get(job.key)
        if stored is None:
            return None
        if not (stored.ok or (stored.kept and not self.retry_failed)):
            job.generation = generation_after(stored.record)
            return None
        result = result_from_record(job.request, stored.record, index=job.index)
        schema = job.request.schema
        if result.ok and schema is not None and schema.model is not None and result.parsed is None:
            return None  # the model's code changed and the stored answer no longer passes it: ask again
        self.emit(job, result)
        return result

    async def execute(self, job: Job) -> Result:
        """Run a job, or share the result of an identical one in flight or already stored."""
        if job.key is None:
            return await self.run(job)
        gate = self.runtime.gate
        try:
            while (leader := self._inflight.get(job.key)) is not None:
                lease = gate.idle()  # the leader may need a slot of the gate to go on: lent meanwhile
                try:
                    shared = await asyncio.shield(leader)
                except BaseException:
                    gate.busy(lease)
                    raise
                if isinstance(shared.error, CancelledError):  # it goes on: another leader, or its own run
                    await gate.back(lease, job.priority, job.seq)
                    continue
                gate.busy(lease)  # it ends now (over the cap for a moment, if its slot was lent)
                free = 0.0 if shared.cost_usd is not None else None  # paid for once, by the leader
                result = dataclasses.replace(
                    shared, request=job.request, index=job.index, cached=True, cost_usd=free, reask_cost_usd=free
                )
                self.emit(job, result)
                return result
        except asyncio.CancelledError:
            job.cancelled = self.finish(
                job, Tally(asyncio.get_running_loop().time()), error=CancelledError(_NEVER_SENT)
            )
            raise
        stored = self.from_store(job)  # checked here, after the gate: an identical one may have landed
        if stored is not None:
            return stored
        future = self._inflight[job.key] = asyncio.get_running_loop().create_future()
        try:
            result = await self.run(job)
        except BaseException:
            future.set_result(Result(job.request, error=CancelledError("cancelled")))
            raise
        finally:
            if self._inflight.get(job.key) is future:
                del self._inflight[job.key]
        future.set_result(result)
        return result

    def in_flight(self, key: str) -> bool:
        """Whether a request of ``key`` is being run (or :meth:`hold` holds it)."""
        return key in self._inflight

    def hold(self, keys: list[str]) -> Callable[[], None]:
        """Mark ``keys`` (none of them :meth:`in_flight`) as in flight while their answers are
        stored outside the engine (a provider batch's write-back): an identical request
        meanwhile waits, then finds the answer stored. Returns what ends the hold."""
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        for key in keys:
            self._inflight[key] = future

        def release() -> None:
            for key in keys:
                if self._inflight.get(key) is future:
                    del self._inflight[key]
            future.set_result(Result(None, error=CancelledError("stored outside the engine")))  # sharers look again

        return release

    async def run(self, job: Job) -> Result:
        """Attempt until an outcome, then record it (durably, with a store) and report it."""
        loop = self._loop  # as job() left it (see JobPlanning.loop)
        assert loop is not None
        tally = Tally(loop.time())
        deadline = self.deadline(tally)
        try:
            outcome = await self.until_outcome(job, tally, deadline, hand_over=self.settling)
            if isinstance(outcome, SluiceError):
                result = self.finish(job, tally, error=outcome, emit=False)
            elif job.request.schema is None:
                result = self.finish(job, tally, reply=outcome, emit=False)
            else:  # it must parse: checked, and re-asked while it does not
                first, asked = tally.charged, job.request
                try:
                    reply, error, parsed = await until_valid(self, job, tally, deadline, outcome)
                finally:
                    job.request = asked  # the result is the line's, not its latest re-ask's
                result = self.finish(job, tally, reply=reply, error=error, emit=False, parsed=(parsed, first))
        except asyncio.CancelledError:
            note = "it was sent and may have been answered" if tally.sent else "it was never sent"
            job.cancelled = self.finish(job, tally, error=CancelledError(f"cancelled; {note}"))
            raise
        if self.store is None:  # nothing to make durable (nor an intent to settle): no coroutine for it
            tally.unsettled = None
            self.runtime.emit(result)
            return result
        try:
            await self.record(job, tally, result)
        except asyncio.CancelledError:  # cut off while its outcome was being stored (a grace ran out)
            job.cancelled = result  # what happened, not "never sent": the write goes on in the writer
            self.runtime.emit(result)
            raise
        self.runtime.emit(result)
        return result

    def deadline(self, tally: Tally) -> float | None:
        """When the job's ``RetryPolicy.deadline`` runs out (the loop's clock)."""
        return tally.started + self.retry.deadline if self.retry.deadline is not None else None

    # -- the one loop ---------------------------------------------------------------------------

    async def until_outcome(
        self,
        job: Job,
        tally: Tally,
        deadline: float | None,
        send: Callable[[Route], Awaitable[_A]] | None = None,
        *,
        hand_over: bool = False,
        streamed: bool = False,
    ) -> _A | Reply | SluiceError:
        """Attempt until an answer, a final error, the attempt budget, the deadline or a stop.

        ``send`` sends one attempt to the deployment chosen for it (an embeddings pack, a
        stream's opening); by default the job's chat request. A stop (batch work only)
        ends it with a ``CancelledError`` outcome, never a cancelled task; any other
        cancellation propagates, with what the attempt held settled."""
        if self.tracer is not None and job.trace is None:
            job.trace = self.tracer.request(job)
        try:
            while True:
                if self.runtime.stopping and job.batch:  # not sent (again): the rerun does it
                    return CancelledError(stopped_note(tally))
                outcome = await self.attempt(job, tally, deadline, send, hand_over=hand_over, streamed=streamed)
                if job.trace is not None and not isinstance(outcome, Opening):  # a stream's ends with it
                    job.trace.attempt_done(outcome)
                if not isinstance(outcome, SluiceError) or isinstance(outcome, ParkedError):
                    return outcome  # an answer, or the provider holds it for later: asked again then
                if not tally.sent_this_time:  # budget, capacity, deadline, store or stop: final
                    return outcome
                delay = self.after_failure(job, outcome, tally.attempts - job.attempts_before, deadline)
                if delay is None:
                    return outcome
                settle_unsettled(tally, self.store, self.runtime.store_failed)  # it goes again
                if delay > 0 and not isinstance(outcome, RateLimitError):  # a 429's pause is the limiter's
                    await self._back_off(job, delay)
        except asyncio.CancelledError as exc:
            settle_unsettled(tally, self.store, self.runtime.store_failed)
            if job.trace is not None:
                job.trace.attempt_done(exc)
            if not self.runtime.absorb_stop():
                raise
            return CancelledError(stopped_note(tally))  # stop() wants a result, not a cancelled task

    async def _back_off(self, job: Job, delay: float) -> None:
        """A retry's backoff, its slot of the gate idle meanwhile (lent to who needs it)."""
        gate = self.runtime.gate
        lease = gate.idle()
        try:
            with self.runtime.waiting_while(job.batch):
                await asyncio.sleep(delay)
            await gate.back(lease, job.priority, job.seq)
        finally:
            gate.busy(lease)

    async def attempt(
        self,
        job: Job,
        tally: Tally,
        deadline: float | None,
        send: Callable[[Route], Awaitable[_A]] | None = None,
        *,
        hand_over: bool = False,
        streamed: bool = False,
    ) -> _A | Reply | SluiceError:
        """One attempt: admission (money, capacity, the intent), then the provider. What
        the slot holds is settled before it returns, whatever happens (unless the send
        returns an :class:`Opening`: then its caller settles it).

        ``hand_over``: the intent's settlement is left in ``tally.unsettled``, for the
        caller to write with the result (one store write per answer). An answer sent whole
        is silent until it is ready, so its ``idle_timeout`` is timed here too (moved on
        while a slow body keeps arriving); a stream's (``streamed``) is its transport's,
        between chunks."""
        slot = self.admit_at_once(job, tally)
        if slot is None:
            slot = await self.admit(job, tally, deadline)
        elif isinstance(slot, SluiceError):
            return slot
        elif slot.held_back:  # placed, but the send pacer holds it back a moment
            slot = await self.admit(job, tally, deadline, placed=slot)
        if isinstance(slot, SluiceError):
            return slot
        route: Route = slot.route
        retry = self.retry
        loop = self._loop  # as the job's making left it (see JobPlanning.loop)
        assert loop is not None
        slot.sending(slot.ready_at)
        trace = job.trace
        sent_at = slot.sent_at
        untimed = route.deployment.tier == "batch"  # a batch line waits for its batch (its own window)
        timeout = None if untimed else retry.attempt_timeout
        if deadline is not None and not untimed and (timeout is None or deadline - sent_at < timeout):
            timeout = deadline - sent_at
        hard = sent_at + timeout if timeout is not None else None
        idle = None if streamed or untimed else retry.idle_timeout
        if idle is not None and hard is not None and sent_at + idle >= hard:
            idle = None  # the attempt timeout comes first
        charge: float | None = None  # None: it may have been billed, at its worst case
        answered = cut_off = timed_out = kept = False
        failure: SluiceError | None = None  # why it failed, and what it answered: for the timeline
        usage: Usage | None = None
        ended: float | None = None  # when the answer came (None: ask the loop when it settles)
        # one shared timer for every attempt's timeouts, not an asyncio.timeout() each; the
        # provider moves the idle one on while a slow body keeps arriving (``_arrival``)
        watch = None
        if idle is not None:
            watch = self.timer.arm(loop, sent_at + idle, idle=idle, hard=hard if hard is not None else float("inf"))
        elif hard is not None:
            watch = self.timer.arm(loop, hard)
        listened = listening.set(watch) if idle is not None else None
        entered = None
        try:
            try:
                if trace is not None:  # inside: whatever it does, the slot is settled below
                    trace.attempt(route, tally.attempts)
                    entered = trace.enter()
                if send is None:
                    asked = (
                        job.request
                        if job.cache is None
                        else job.cache.request_for(job.request, route.deployment, sent_at)
                    )
                    reply: _A | Reply = await route.provider.send(
                        asked, route.deployment, idempotency_key=job.idempotency_key
                    )
                else:
                    reply = await send(route)
            finally:
                timed_out = self.timer.disarm(watch)
                if listened is not None:
                    listening.reset(listened)
                if trace is not None:
                    trace.leave(entered)
        except asyncio.CancelledError:
            if timed_out:  # the timer's own cancellation: a timeout
                assert watch is not None
                failure = _timed_out(route, timeout, idle if watch.idle_ran_out else None)
                return failure
            cut_off = True
            raise
        except TimeoutError:
            failure = _timed_out(route, timeout, None)
            return failure
        except ProviderError as exc:
            if not exc.maybe_billed:
                charge = 0.0
            if exc.read_back:  # a batch's verdict kept in the state: not sent now
                self.stats.attempts -= 1
            failure = exc
            return exc
        except ParkedError as exc:  # journalled by the provider: its money stays held till it is asked again
            charge = 0.0
            hold = slot.keep_hold()
            if hold is not None:
                key = job.idempotency_key  # the line's name at the provider (its batch's custom_id)
                assert key is not None  # a parking provider journals: there is a store
                self.spending.park(key, hold)
            self.router.released(route)  # no verdict on the deployment
            if exc.read_back:  # it joined a batch sent before (by an earlier run, or an identical line)
                self.stats.attempts -= 1
            failure = exc
            return exc
        except SluiceError as exc:  # raised before anything went out (a missing key, say)
            charge = 0.0
            failure = exc
            return exc
        except Exception as exc:  # a provider's own bug must not take the whole job down
            failure = FatalProviderError(f"{type(exc).__name__} in provider {route.provider.name!r}: {exc}")
            return failure
        else:
            if isinstance(reply, Opening):  # the answer goes on: its caller settles
                reply.slot = slot
                kept = True
                return reply
            if getattr(reply, "read_back", False):  # not sent now: a batch's answer kept in the state
                self.stats.attempts -= 1
            if reply.ratelimit is not None:  # learn before the slot frees and wakes the next
                route.limiter.observe(reply.ratelimit)
            usage = reply.usage
            slot.reconcile(usage, job.tokens)
            charge = self.spending.cost(route.deployment, usage) or 0.0
            answered = True
            ended = loop.time()
            self.router.succeeded(route, ended - slot.sent_at, reply.usage.output_tokens, slot.placed_at)
            return reply
        finally:
            if not kept:
                slot.settle(
                    charge,
                    answered=answered,
                    cut_off=cut_off,
                    hand_over=hand_over,
                    now=ended,
                    error=failure,
                    usage=usage,
                )
                if cut_off:  # cancelled at the provider: no verdict on the deployment (a probe is freed)
                    self.router.released(route)
            if failure is not None:  # an outcome, a value: its traceback would hold this frame in a cycle
                failure.__traceback__ = None  # (freed only by a collection, rare in a job: see fewer_collections)

    def after_failure(self, job: Job, error: SluiceError, attempt: int, deadline: float | None) -> float | None:
        """Learn from a failed attempt; the delay before the next, or None to give up.

        The next attempt may go elsewhere: to another deployment of the group (at once,
        when one has not failed this request yet), or to the next model of the request's
        fallbacks when the error says this model cannot take it (its context window, its
        content policy) or every deployment of the model has failed it.
        """
        route = job.route
        if isinstance(error, ProviderError) and error.ratelimit is not None:
            route.limiter.observe(error.ratelimit)
        timeline = self.timeline
        if isinstance(error, RateLimitError):
            self.stats.rate_limited += 1
            # the server's hint within RetryPolicy.max_retry_after, else the un-jittered backoff:
            # one 429 saying "retry-after: 86400" must not pause a deployment for a day
            pause = self.retry.pause(error, attempt)
            route.limiter.penalize(pause)
            if timeline is not None and pause > 0:
                timeline.cooldown(route.deployment, pause, f"429: paused {pause:g} s")
        if not isinstance(error, MovedToSyncError):  # a plan's move, not the deployment failing
            cooling = self.router.failed(route, error, guarded=job.guarded, placed_at=job.placed_at)
            if cooling and timeline is not None:
                left = route.health.cooling(asyncio.get_running_loop().time())
                timeline.cooldown(route.deployment, left, f"{route.health.failures} failures in a row ({error.kind})")
        if job.guarded:
            job.tried = {*job.tried, route}
        can_fall_back = job.step + 1 < len(job.groups)
        # a plan's move to the model is not a retry: it goes, however many batches tried
        if attempt >= self.retry.max_attempts and not (can_fall_back and isinstance(error, MovedToSyncError)):
            return None
        elsewhere = job.guarded and any(r not in job.tried for r in job.groups[job.step].routes)
        if can_fall_back and (model_cannot_take(error) or (deployment_fault(error) and not elsewhere)):
            self.fall_back(job)  # this model cannot take it, or none of its deployments can be used
            delay = 0.0
        elif elsewhere and deployment_fault(error):  # this deployment's key, model or setup
            delay = 0.0
        elif not self.retry.should_retry(error, attempt):
            return None
        else:
            delay = 0.0 if elsewhere else self.retry.delay(error, attempt)
        now = asyncio.get_running_loop().time()
        if deadline is not None and now + delay >= deadline:
            return None
        self.stats.retries += 1
        if self.on_retry is not None:
            try:
                self.on_retry(RetryEvent(job.request, error, attempt, delay, route.deployment.label))
            except Exception:
                self.stats.hook_errors += 1
                _log.exception("the on_retry hook raised; carrying on")
        return delay

    # -- the end --------------------------------------------------------------------------

    def finish(
        self,
        job: Job,
        tally: Tally,
        *,
        error: SluiceError | None = None,
        reply: Reply | None = None,
        emit: bool = True,
        parsed: tuple[Any, float] | None = None,
    ) -> Result:
        """The job's Result from its tally and its outcome (reported too, with ``emit``);
        ``parsed``: a schema's answer, and what was charged before its re-asks."""
        loop = self._loop  # as the job's making left it (see JobPlanning.loop)
        assert loop is not None
        now = loop.time()
        priced = self.spending.pricing.has_price(job.route.deployment)
        result = _make_result(
            job.request,
            text=reply.text if reply is not None else None,
            error=error,
            usage=reply.usage if reply is not None else Usage(),
            raw=reply.raw if reply is not None else None,
            attempts=tally.attempts,
            timings=_make_timings(
                queued=tally.started - job.submitted,
                limiter_wait=tally.waited,
                latency=tally.latency,
                total=now - job.submitted,
            ),
            deployment=job.route.deployment.label,
            model=job.route.deployment.model if tally.attempts else None,
            finish_reason=reply.finish_reason if reply is not None else None,
            request_id=reply.request_id if reply is not None else None,
            index=job.index,
            cost_usd=tally.charged if priced and tally.attempts else None,
            tier=job.route.deployment.tier if tally.attempts else None,
            batch_id=reply.batch_id if reply is not None else None,
        )
        if parsed is not None:  # before the tracer sees it: re-asks are not retries
            result = dataclasses.replace(
                result, parsed=parsed[0], reasks=job.reasks, reask_cost_usd=reask_cost(result, parsed[1])
            )
        if self.tracer is not None:
            self.tracer.finished(job, result)
        if emit:
            self.runtime.emit(result)
        return result

    def emit(self, job: Job, result: Result) -> None:
        """Report a Result not made by :meth:`finish` (a stored answer, a twin's)."""
        if self.tracer is not None:
            self.tracer.finished(job, result)
        self.runtime.emit(result)

    async def record(self, job: Job, tally: Tally, result: Result) -> None:
        """Make the Result durable before anyone is told (with the last attempt's intent
        settled in the same write, when the store can). A cancelled job, or one never sent,
        is not stored: the rerun does it."""
        store = self.store
        if job.key is None or store is None or not tally.attempts or isinstance(result.error, _UNSTORED):
            settle_unsettled(tally, store, self.runtime.store_failed)
            return
        unsettled, tally.unsettled = tally.unsettled, None
        if unsettled is not None and self.settling:
            intent, charge, answered = unsettled
            await self.durably(
                cast("SettlingStore", store).put_settled(job.key, result, intent, charge, answered=answered)
            )
            return
        if unsettled is not None:
            try:
                store.settle(*unsettled[:2], answered=unsettled[2])
            except StoreError as exc:
                self.runtime.store_failed(exc)
        await self.durably(store.put(job.key, result))

    async def durably(self, write: Awaitable[Any]) -> None:
        """Await a store write; a store that cannot take it stops the engine (the answer still
        goes out: the output may keep it)."""
        try:
            await write
        except StoreError as exc:
            self.runtime.store_failed(exc)


def _timed_out(route: Route, timeout: float | None, idle: float | None) -> AttemptTimeoutError:
    label = route.deployment.label
    if idle is not None:
        return AttemptTimeoutError(f"{label} sent nothing for {idle:g} s (idle timeout)")
    if timeout is None:  # the provider's own timeout
        return AttemptTimeoutError(f"timed out talking to {label}")
    return AttemptTimeoutError(f"no answer from {label} within {timeout:g} s")
