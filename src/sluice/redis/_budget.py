"""A named budget that any processes share, kept in Redis.

Same rule as the local budget: each request reserves its worst-case cost before it is
sent (a Lua script checks ``spent + reserved + amount <= limit`` and takes the hold
atomically), commits its actual cost after, and releases the hold if it failed. Money is
counted in integer micro-dollars in Redis, so sums never drift.

Holds are leases: a live process refreshes its holds; a hold whose holder died expires
and is **counted as spent at its worst case**, never returned. The holder may have died
after the provider billed the request, and nothing else will ever say what it cost; the
local store does the same with an intent left open by a crash. Overcounting a dead
process's request can stop a job early (rerun with a larger budget); undercounting could
overspend, which a budget must never do. Only if the holder was alive after all (Redis
was down longer than the lease, so it could not refresh) does its late settle correct
the count to what the request cost.

A request that does not fit while other holds exist waits: woken by a pub/sub message
when a hold is settled anywhere, or at the next hold's expiry (a timer, no polling); only
one waiter per process talks to Redis at a time (FIFO). When nothing is held and it still
does not fit, it is refused with :class:`~sluice.BudgetExhaustedError`.

Redis losing its data (restarted without persistence, flushed, keys evicted) must not
reset what was spent. A settle whose hold Redis lost counts its cost all the same; a
process made with ``create=False`` (a job's workers) never re-creates a budget Redis no
longer has: it waits until the owner sets it again, with what its records say was spent
(``set_limit(usd, spent_at_least=...)``, one atomic step; a job's coordinator does this).
What stays uncounted is what only Redis knew: answers that were waiting in Redis to be
written (at most the job's feeding window); a bare ``RedisBudget`` whose every process
creates starts again from $0 spent. Run Redis with persistence (AOF).

Setting the limit: the first process to use a name sets its limit (``usd``); a process
that asks a different ``usd`` for the same name uses the limit already in Redis and logs
a warning once (a worker must not fail its requests because a coordinator's rerun
raised the budget); a coordinator changes it for everyone, on purpose, with
:meth:`RedisBudget.set_limit`. ``limit`` is the one in Redis as last seen. ``spent`` persists
in Redis (for ``ttl_days`` after the last use), so a rerun counts what earlier runs
spent; :meth:`RedisBudget.count_spent_before` raises it to at least what the caller's own
records say (idempotent: ``max``, never added twice).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import math
import uuid
from dataclasses import dataclass
from typing import Any

from .._budget import BudgetExhaustedError
from .._errors import ConfigError
from . import _scripts
from ._connection import Connection, RedisDown, RedisFailed

__all__ = ["BudgetTotals", "RedisBudget", "SharedBudgetHold"]

log = logging.getLogger("sluice.redis")

MICRO = 1_000_000


def _micro_up(usd: float) -> int:
    return math.ceil(round(usd * MICRO, 6))


def _micro_down(usd: float) -> int:
    """A limit in micro-dollars: rounded down, as costs and holds are rounded up, so that
    what is granted never exceeds the dollars asked, even by a fraction of a micro-dollar."""
    return math.floor(round(usd * MICRO, 6))


@dataclass(frozen=True, slots=True)
class BudgetTotals:
    """The shared budget as Redis has it, in US dollars."""

    limit: float
    spent: float
    reserved: float
    #: Of ``spent``: holds whose holder died, counted at their worst case.
    expired: float

    @property
    def remaining(self) -> float:
        return self.limit - self.spent - self.reserved


class SharedBudgetHold:
    """One request's hold on the shared budget; settled once, in the background."""

    __slots__ = ("_budget", "_open", "amount", "id")

    def __init__(self, budget: RedisBudget, hold_id: str, amount: float) -> None:
        self._budget = budget
        self.id = hold_id
        self.amount = amount
        self._open = True

    def commit(self, actual: float) -> None:
        """The request cost ``actual`` (0: it failed, or was never sent)."""
        if self._open:
            self._open = False
            self._budget._settle(self, actual)

    def release(self) -> None:
        self.commit(0.0)


class RedisBudget:
    """A named budget shared by every process that uses ``name`` on this Redis
    (see the module docstring). ``Engine(shared_budget=RedisBudget(url, name, usd))``."""

    def __init__(
        self,
        url: str,
        name: str,
        usd: float,
        *,
        namespace: str = "sluice",
        lease_seconds: float = 30.0,
        ttl_days: float = 30.0,
        create: bool = True,
    ) -> None:
        if isinstance(usd, bool) or not isinstance(usd, (int, float)) or not usd >= 0 or not math.isfinite(usd):
            raise ConfigError(f"the shared budget {name!r} must be a number of US dollars >= 0, got {usd!r}")
        if not name:
            raise ConfigError("a shared budget needs a name (the job's id, say)")
        self.name = name
        self.limit = float(usd)
        self.lease_seconds = lease_seconds
        #: False: this process only joins the budget; while Redis has no such budget (its
        #: owner has not made it yet, or Redis lost it) reservations wait, none is granted.
        self.create = create
        self.connection = Connection(url, namespace=namespace)
        prefix = f"{namespace}:budget:{{{name}}}:"
        self._keys = [prefix + "totals", prefix + "holds", prefix + "amounts", prefix + "expired"]
        self._channel = self.connection.channel("budget", name)
        self._ttl_ms = str(int(ttl_days * 86_400_000))
        self._ids = itertools.count()
        self._process = uuid.uuid4().hex[:12]
        self._held: set[str] = set()
        self._refresher: asyncio.Task[None] | None = None
        self._turn: asyncio.Lock | None = None
        self._kick: asyncio.Event | None = None
        self._listening = False
        self._warned = False
        self._said_missing = False

    @property
    def healthy(self) -> bool:
        return self.connection.healthy

    @property
    def problem(self) -> str | None:
        return self.connection.problem

    async def reserve(self, amount: float) -> SharedBudgetHold:
        """Hold ``amount`` dollars (a request's worst case): waits while other holds may
        free money; :class:`BudgetExhaustedError` when nothing is held and it does not fit.
        While Redis is down it waits (nothing is admitted) and retries with backoff."""
        if self._turn is None:
            self._turn = asyncio.Lock()
            self._kick = asyncio.Event()
        if not self._listening:
            self._listening = True
            self.connection.listen(self._channel, self._wake)
        micro = _micro_up(max(0.0, amount))
        async with self._turn:  # FIFO: one waiter per process asks Redis at a time
            while True:
                hold_id = f"{self._process}:{next(self._ids)}"
                asked = str(_micro_down(self.limit)) if self.create else "-1"
                args = [hold_id, str(micro), repr(self.lease_seconds * 1000), self._ttl_ms, asked]
                call = asyncio.ensure_future(
                    self.connection.run("budget_reserve", _scripts.BUDGET_RESERVE, self._keys, args)
                )
                try:
                    # Shielded: a request cancelled while Redis's reply is on its way must not
                    # leave a hold nobody settles (it would expire into spent, at its worst case).
                    reply = await asyncio.shield(call)
                except asyncio.CancelledError:
                    call.add_done_callback(functools.partial(self._release_if_granted, hold_id, amount))
                    raise
                except RedisDown:
                    await self._sleep(self.connection.backoff())
                    continue
                status, value = int(reply[0]), float(reply[1])
                if float(reply[2]) < 0:  # a joiner, and Redis has no such budget (now)
                    self._missing()
                    await self._sleep(1.0)
                    continue
                self._adopt(float(reply[2]) / MICRO)
                if status == 1:
                    self._held.add(hold_id)
                    self._ensure_refresher()
                    return SharedBudgetHold(self, hold_id, amount)
                if status == 0:
                    await self._sleep(max(0.0, value) / 1000)
                    continue
                raise BudgetExhaustedError(
                    f"not run: its worst case ${amount:.4f} exceeds the ${max(0.0, value) / MICRO:.4f} left of "
                    f"the shared budget {self.name!r} (${self.limit:.2f}); rerun with a larger budget to resume"
                )

    def _release_if_granted(self, hold_id: str, amount: float, call: asyncio.Future[Any]) -> None:
        """The reserve of a cancelled request came back: give back a hold it was granted."""
        if call.cancelled() or call.exception() is not None:
            return
        if int(call.result()[0]) == 1:
            self._settle(SharedBudgetHold(self, hold_id, amount), 0.0)

    def _missing(self) -> None:
        if not self._said_missing:
            self._said_missing = True
            log.warning(
                "Redis at %s has no shared budget %r (its owner has not set it, or Redis lost its "
                "data): nothing is admitted against it until it is set again",
                self.connection.target,
                self.name,
            )

    def _adopt(self, stored: float) -> None:
        """The limit in Redis is the budget's: say so once if this process asked another."""
        if abs(stored - self.limit) >= 1 / MICRO:
            if not self._warned:
                self._warned = True
                log.warning(
                    "the shared budget %r has a limit of $%.2f (set by the first process to use it); "
                    "this process asked $%.2f and uses $%.2f (RedisBudget.set_limit() changes it for all)",
                    self.name,
                    stored,
                    self.limit,
                    stored,
                )
            self.limit = stored

    async def totals(self) -> BudgetTotals:
        """Limit, spent, reserved as Redis has them now (expired holds counted first)."""
        return await self._adjust("spent_at_least", 0)

    async def set_limit(self, usd: float, *, spent_at_least: float | None = None) -> BudgetTotals:
        """Change the limit for every process (a coordinator's rerun with a larger budget);
        with ``spent_at_least``, also :meth:`count_spent_before` in the same atomic step."""
        self.limit = float(usd)
        floor = -1 if spent_at_least is None else _micro_up(spent_at_least)
        return await self._adjust("limit", _micro_down(usd), floor)

    async def count_spent_before(self, usd: float) -> BudgetTotals:
        """Make ``spent`` at least ``usd`` (what earlier runs spent, by the caller's records).
        Idempotent: a maximum, never an addition, so it is safe on every start."""
        return await self._adjust("spent_at_least", _micro_up(usd))

    async def flush(self) -> None:
        """Wait for every settle started so far to reach Redis (or be dropped if it is down)."""
        await self.connection.flush()

    async def close(self) -> None:
        if self._refresher is not None:
            self._refresher.cancel()
        await self.connection.close()

    async def __aenter__(self) -> RedisBudget:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<RedisBudget {self.name!r} ${self.limit:.2f} on {self.connection.target} holds={len(self._held)}>"

    # -- internals ------------------------------------------------------------------------

    async def _adjust(self, op: str, micro: int, floor: int = -1) -> BudgetTotals:
        reply = await self.connection.run(
            "budget_adjust",
            _scripts.BUDGET_ADJUST,
            self._keys,
            [op, str(micro), self._ttl_ms, self._channel, str(floor)],
        )
        stored, spent, reserved, expired = (float(v or 0) / MICRO for v in reply)
        if op == "limit":
            self._warned = False
        if reply[0] is not None:  # a budget nobody has set yet keeps the limit this process asks
            self.limit = stored
        return BudgetTotals(limit=self.limit, spent=spent, reserved=reserved, expired=expired)

    def _settle(self, hold: SharedBudgetHold, actual: float) -> None:
        self._held.discard(hold.id)
        args = [hold.id, str(_micro_up(max(0.0, actual))), self._ttl_ms, self._channel]
        self.connection.spawn(self.connection.run("budget_settle", _scripts.BUDGET_SETTLE, self._keys, args))

    def _wake(self) -> None:
        if self._kick is not None:
            self._kick.set()

    async def _sleep(self, seconds: float) -> None:
        kick = self._kick
        assert kick is not None
        if not kick.is_set():
            try:
                async with asyncio.timeout(seconds):
                    await kick.wait()
            except TimeoutError:
                pass
        kick.clear()

    def _ensure_refresher(self) -> None:
        if self._refresher is None or self._refresher.done():
            self._refresher = asyncio.get_running_loop().create_task(self._refresh())

    async def _refresh(self) -> None:
        """Keep this process's holds alive while it has any (a dead process's expire)."""
        while self._held:
            await asyncio.sleep(self.lease_seconds / 3)
            if not self._held:
                break
            try:
                await self.connection.run(
                    "budget_refresh",
                    _scripts.BUDGET_REFRESH,
                    [self._keys[1]],
                    [repr(self.lease_seconds * 1000), *sorted(self._held)],
                )
            except (RedisDown, RedisFailed):
                continue  # said once by the connection; the lease then expires on its own
        self._refresher = None
