"""Admission: money, then capacity, then (with a store) the durable intent, before an
attempt is sent. Part of the attempt core (:class:`~sluice._attempts.Attempts` is one).

The common case (no budget, no intent to write, room at once, not held back by the send
pacer) is :meth:`Admission.admit_at_once`, with no coroutine: a request admitted this
way costs a few calls. Anything that must wait (money, a deployment with room, the
intent's write, the pacer, a fallback when a group is exhausted) is :meth:`Admission.admit`.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from ._errors import CancelledError, DeadlineExceededError, GroupExhausted, SluiceError
from ._planning import JobPlanning
from ._slot import Slot, Tally, stopped_note

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._budget import BudgetHold
    from ._errors import StoreError
    from ._job import Job
    from ._limits import Reservation
    from ._retry import RetryPolicy
    from ._router import Route
    from .store import AttemptLog

__all__ = ["Admission"]


class Admission(JobPlanning):
    """The admission half of the attempt core (see the module docstring)."""

    retry: RetryPolicy
    timeline: AttemptLog | None
    _worst_of: Callable[[Job], float]
    _store_failed: Callable[[StoreError], None]

    def admit_at_once(self, job: Job, tally: Tally) -> Slot | SluiceError | None:
        """:meth:`admit` when nothing has to be waited for (no budget, no intent to write,
        room at once, not held back by the send pacer): no coroutine on the common path.
        None when it must wait: :meth:`admit` then takes it from the start, nothing taken."""
        tally.sent_this_time = False
        if job.budget is not None or (job.key is not None and self.store is not None):
            return None
        try:
            granted = self._room_at_once(job)
        except SluiceError as exc:  # a limit learnt since that it can never fit
            return exc
        if granted is None:
            return None
        slot = self._slot(job, tally, granted, None)
        loop = self._loop  # as the job's making left it (see JobPlanning.loop)
        assert loop is not None
        now = loop.time()
        slot.held_back = slot.send_delay(now)  # 0 unless what came before it left late
        return slot if slot.held_back > 0 else self._ready(job, tally, slot, now)

    async def admit(
        self, job: Job, tally: Tally, deadline: float | None, *, placed: Slot | None = None
    ) -> Slot | SluiceError:
        """Money, then capacity, then (with a store) the durable intent: a Slot ready to
        send, or why the attempt cannot be made (final: it was not sent). ``placed``: a
        slot :meth:`admit_at_once` placed that the send pacer holds back: it waits here."""
        router, runtime = self.router, self.runtime
        loop = self.loop
        if placed is None:
            tally.sent_this_time = False
            hold: BudgetHold | None = None
            try:
                # tried again after admit_at_once found no room: one call, on the path that waits anyway
                granted = self._room_at_once(job) if job.budget is None else None
                if granted is None:
                    granted, hold = await self._wait_for_room(job, tally, deadline)
            except TimeoutError:
                return DeadlineExceededError(f"its deadline ({self.retry.deadline:g} s) passed while it waited")
            except SluiceError as exc:  # no money left, or a limit learnt since that it can never fit
                return exc
            slot = self._slot(job, tally, granted, hold)
            if job.key is not None and self.store is not None:
                try:
                    failed = await slot.note(job.key)
                except BaseException:
                    router.released(slot.route)
                    raise
                if failed is not None:
                    router.released(slot.route)
                    runtime.store_failed(failed)
                    return CancelledError(f"not sent: {failed.message}")
            delay = slot.send_delay(loop.time())  # 0 unless what came before it left late
        else:
            slot, delay = placed, placed.held_back
        route = slot.route
        if delay > 0:
            try:
                with runtime.waiting_while(job.batch):
                    await asyncio.sleep(delay)
            except BaseException:
                slot.unsent()
                router.released(route)
                raise
        return self._ready(job, tally, slot, loop.time())

    def _room_at_once(self, job: Job) -> tuple[Route, Reservation] | None:
        """A deployment of the job's group with room now, and its reservation; or None."""
        return self.router.try_acquire(
            job.groups[job.step],
            job.tokens,
            job.tried,
            guarded=job.guarded,
            can_fall_back=job.step + 1 < len(job.groups),
            output=job.output,
            prefer=job.cache.routes if job.cache is not None else (),
        )

    def _slot(self, job: Job, tally: Tally, granted: tuple[Route, Reservation], hold: BudgetHold | None) -> Slot:
        """The admitted attempt: its route, reservation and hold (and the store for its intent)."""
        route, reservation = granted
        job.route = route
        job.placed_at = route.health.epoch
        store = self.store if job.key is not None else None
        return Slot(
            route,
            reservation,
            hold,
            tally,
            self.stats,
            self._worst_of,
            job,
            store,
            self._store_failed,
            job.placed_at,
            self.timeline,
        )

    def _ready(self, job: Job, tally: Tally, slot: Slot, now: float) -> Slot | SluiceError:
        """The slot, ready to send now; or, when the engine is stopping batch work, released."""
        if self.runtime.stopping and job.batch:
            slot.unsent()
            self.router.released(slot.route)
            return CancelledError(stopped_note(tally))
        slot.ready_at = now
        return slot

    async def _wait_for_room(
        self, job: Job, tally: Tally, deadline: float | None
    ) -> tuple[tuple[Route, Reservation], BudgetHold | None]:
        """The slow path of admission: wait for money, then for a deployment with room
        (moving to a fallback when the group is exhausted); the grant and the hold.

        While it waits, its slot of the engine's gate is idle: lent to a request waiting
        at the gate (for another deployment, perhaps, with room), and taken back, ahead of
        newcomers, once the grant is in (see :mod:`._gate`)."""
        loop = asyncio.get_running_loop()
        router = self.router
        gate = self.runtime.gate
        waited_from = loop.time()
        hold: BudgetHold | None = None
        granted: tuple[Route, Reservation] | None = None
        lease = gate.idle()
        try:
            while granted is None:
                with self.runtime.waiting_while(job.batch):
                    async with asyncio.timeout_at(deadline):
                        hold = self._parked_hold(job) or await self.spending.reserve(job.budget, job.worst_cost)
                        try:
                            granted = await router.acquire(
                                job.groups[job.step],
                                job.tokens,
                                job.priority,
                                job.seq,
                                job.tried,
                                guarded=job.guarded,
                                can_fall_back=job.step + 1 < len(job.groups),
                                output=job.output,
                                prefer=job.cache.routes if job.cache is not None else (),
                                patience=job.cache.patience if job.cache is not None else 0.0,
                            )
                        except GroupExhausted:
                            _commit(hold, 0.0)
                            hold = None
                            self.fall_back(job)
                        else:
                            await gate.back(lease, job.priority, job.seq)
            return granted, hold
        except BaseException:
            if granted is not None:  # granted, then cancelled (or out of time) taking its slot back
                granted[1].refund()
                router.released(granted[0])
            _commit(hold, 0.0)
            raise
        finally:
            gate.busy(lease)  # its slot again however it ended: the front end releases it
            tally.waited += loop.time() - waited_from

    def _parked_hold(self, job: Job) -> BudgetHold | None:
        """The hold this request kept when it was parked (asked again now), if any."""
        if job.budget is None or not self.spending.holds_parked:
            return None
        key = job.idempotency_key  # as parked (see Attempts.attempt)
        if key is None:
            return None
        return self.spending.unpark(job.budget, key, job.worst_cost)


def _commit(hold: BudgetHold | None, charge: float) -> None:
    if hold is not None:
        hold.commit(charge)
