"""Parked lines whose provider batch answered them, written out from the state directly.

A parked line (see ``_parked``) is read again once its batch has ended. Going through the
engine a second time (a job, admission, an intent written and settled, a send that reads
the answer back from the journal, a Result, its record) cost about as much CPU as the line
had cost the first time, and a 1M-line job was written at a few thousand lines a second
after its last batch ended. Most such lines are plain: an answer, to a request with no
schema, from the one batch deployment its model goes to. Those are written here, a group
at a time: their result lines found with one query per 500, each read once, their results
and charges saved in one transaction *before* their output lines are written (so a kill
-9 in between leaves answers the rerun writes from the state, sending and charging
nothing again), then the output lines in one write. Their records are the engine's,
field by field (but ``latency_s``: 0, nothing was sent); the budget counted each one's
bill when its batch ended (``Spending.settle_parked``), so nothing is charged twice.

Every other line (a schema, a batch's rejection or no answer, a prompt the cache planner
may place, an answer already stored, an identical request in flight, a line whose bill the
budget did not count) goes through the engine as before.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from typing import TYPE_CHECKING, Any

from .. import _json
from .._errors import StoreError
from .._models import BATCH_SUFFIX, Request, Result, idempotency_key_of, store_key
from .._records import usage_record, usd_record
from .._spending import capped
from ..caching._rules import LOWEST_MINIMUM
from ..providers import max_output_tokens
from ..tiers import BatchTier, batch_request
from ._inputs import InputItem, request_of
from ._output import request_hash

if TYPE_CHECKING:
    from .._engine import Engine
    from .._router import Route
    from ..providers import Reply
    from ..store import SqliteStore
    from ._job import JobProgress, JobSpec
    from ._output import JobOutput
    from ._parked import ParkedLines

__all__ = ["WriteBack"]

#: Lines written back together: one lookup of their answers, one transaction, one write.
GROUP = 2000


class _Line:
    """One plain answer on its way out: what its result row and output record need."""

    __slots__ = ("asked", "batch_id", "custom_id", "item", "key", "prepared", "reply", "route", "sent")

    def __init__(self, item: InputItem, sent: Request, asked: Request, prepared: Request, route: Route) -> None:
        self.item = item
        self.sent = sent  # as the line made it (its request_hash)
        self.asked = asked  # as the engine is asked (--tier auto: the model's batch tier)
        self.prepared = prepared  # as the engine sends it (a budget's cap)
        self.route = route
        self.key = store_key(asked)
        self.custom_id = idempotency_key_of(self.key)
        self.reply: Reply | None = None
        self.batch_id = ""


class WriteBack:
    """The write-back of one chat job's parked lines (see the module docstring)."""

    def __init__(
        self,
        spec: JobSpec,
        engine: Engine,
        store: SqliteStore,
        output: JobOutput,
        progress: JobProgress,
        parking: ParkedLines,
        watch: Callable[[Result], None],
    ) -> None:
        self._spec = spec
        self._engine = engine
        self._store = store
        self._output = output
        self._progress = progress
        self._parking = parking
        self._watch = watch
        self._auto = spec.config.tier == "auto"
        self._routes: dict[str, Route | None] = {}
        attempts = engine.attempts
        #: What makes the engine's pass more than a read of the answer: then every line takes it.
        self.enabled = attempts.tracer is None and engine.spending.cheaper is None and engine.on_result is None

    @staticmethod
    def groups(source: Iterable[InputItem]) -> Iterator[list[InputItem]]:
        """``source`` in groups of :data:`GROUP` lines."""
        lines = iter(source)
        while group := list(islice(lines, GROUP)):
            yield group

    async def write(self, items: list[InputItem]) -> list[InputItem]:
        """Write the plain answers among ``items``; the rest, for the engine."""
        if not self.enabled or self._progress.stopping:
            return items
        rest: list[InputItem] = []
        lines = self._candidates(items, rest)
        if not lines:
            return rest
        stored = self._store.keys_stored([line.key for line in lines])
        saved = self._store.lines_saved([line.custom_id for line in lines if line.key not in stored])
        spending = self._engine.spending
        budget = spending.budget
        plain: list[_Line] = []
        paid: list[float] = []
        for line in lines:
            found = saved.get(line.custom_id)
            reply = None if found is None else _tier(line.route).read_back(found[1])
            bill = None if reply is None or budget is None else spending.take_paid(line.custom_id)
            if reply is None or (budget is not None and bill is None):
                rest.append(line.item)
                continue
            assert found is not None
            line.reply, line.batch_id = reply, found[0]
            plain.append(line)
            paid.append(bill or 0.0)
        if plain:
            await self._write_out(plain, paid)
        return rest

    def _candidates(self, items: list[InputItem], rest: list[InputItem]) -> list[_Line]:
        """The lines of ``items`` that may be plain (their answers not looked at yet)."""
        attempts = self._engine.attempts
        budget = self._engine.spending.budget
        planner = attempts.caching
        keys: set[str] = set()
        lines: list[_Line] = []
        for item in items:
            if item.request is None or item.error is not None or item.embedding is not None:
                rest.append(item)
                continue
            sent = request_of(item, self._spec.cache)
            asked = batch_request(sent) if self._auto else sent
            route = self._route(asked.model) if asked.schema is None else None
            if route is None:
                rest.append(item)
                continue
            deployment = route.deployment
            prepared = capped(asked, deployment) if budget is not None else asked
            if planner is not None:  # a prompt the cache planner may place: the engine's to plan
                tokens = route.provider.estimate_tokens(prepared, deployment)
                if tokens - min(tokens, max_output_tokens(prepared, deployment)) >= LOWEST_MINIMUM:
                    rest.append(item)
                    continue
            line = _Line(item, sent, asked, prepared, route)
            if line.key in keys or attempts.in_flight(line.key):  # an identical one: the engine shares
                rest.append(item)
                continue
            keys.add(line.key)
            lines.append(line)
        return lines

    def _route(self, model: str) -> Route | None:
        """The one batch deployment requests for ``model`` go to first; None when there are
        several (or it is not a batch tier): the engine chooses then."""
        if model not in self._routes:
            routes = self._engine.attempts.router.chain(model)[0].routes
            one = routes[0] if len(routes) == 1 and isinstance(routes[0].provider, BatchTier) else None
            self._routes[model] = one
        return self._routes[model]

    async def _write_out(self, lines: list[_Line], paid: list[float]) -> None:
        """Results and charges durable first, then the output lines; counted as the engine counts."""
        engine = self._engine
        attempts = engine.attempts
        spending = engine.spending
        pricing = spending.pricing
        budget = spending.budget
        stats = engine.stats
        timeline = attempts.timeline
        now = attempts.loop.time()
        finished = time.time()
        rows: list[tuple[Any, ...]] = []
        charges: list[tuple[str, float]] = []
        records: list[bytes] = []
        counted: list[tuple[float | None, bool, str | None]] = []  # cost, capped, finish reason
        for line, bill in zip(lines, paid, strict=True):
            reply = line.reply
            assert reply is not None
            deployment = line.route.deployment
            usage = reply.usage
            charge = max(0.0, spending.cost(deployment, usage) or 0.0)
            if budget is not None and charge > bill:  # beyond what its batch's end counted
                spending.ledger.paid_hold(budget, bill).commit(charge)
            cost = charge if pricing.has_price(deployment) else None
            stats.submitted += 1
            stats.charge(charge, answered=True)
            stats.succeeded += 1
            stats.input_tokens += usage.input_tokens
            stats.output_tokens += usage.output_tokens
            if cost is None:
                stats.unpriced += 1
            attempts.router.succeeded(line.route)
            if timeline is not None:
                timeline.attempt(deployment, now, now, 1, None, usage, charge, None)
            usage_json = usage_record(usage)
            stored = {
                "ok": True,
                "text": reply.text,
                "error": None,
                "usage": usage_json,
                "raw": reply.raw,
                "attempts": 1,
                "latency_s": 0.0,
                "deployment": deployment.label,
                "finish_reason": reply.finish_reason,
                "request_id": reply.request_id,
                "cost_usd": usd_record(cost),
                "model": deployment.model,
                "tier": "batch",
                "batch_id": line.batch_id,
            }
            record = _json.dumps_text(stored)
            rows.append((line.key, 1, None, usage.input_tokens, usage.output_tokens, cost, 1, 0.0, record, finished))
            if charge:
                charges.append((line.key, charge))
            added = _cap_added(line.sent, line.prepared)
            records.append(_json.dumps_line(self._record(line, reply, usage_json, cost, added)))
            counted.append((cost, added is not None, reply.finish_reason))
        release = attempts.hold([line.key for line in lines])
        stored_ok = True
        try:
            await self._store.put_answered(rows, charges)
        except StoreError as exc:  # the engine stops; the answers still go out (the output may keep them)
            stored_ok = False
            attempts.runtime.store_failed(exc)
        finally:
            release()
        first = lines[0]
        self._watch(Result(first.prepared, text=first.reply.text if first.reply else None, tier="batch"))
        self._count(lines, counted, written=self._output.write_now(records), stored=stored_ok)

    def _record(
        self, line: _Line, reply: Reply, usage: dict[str, int], cost: float | None, added: int | None
    ) -> dict[str, Any]:
        """The output record, as ``output_record`` makes it of the engine's Result."""
        item, prepared, deployment = line.item, line.prepared, line.route.deployment
        own = prepared.id if prepared.id is not None else store_key(prepared)
        record: dict[str, Any] = {"line": item.line, "id": item.custom_id or own}
        if item.custom_id is not None:
            record["custom_id"] = item.custom_id
        parks = self._parking.times(item.line)
        record["ok"] = True
        record["text"] = reply.text
        record["response"] = reply.raw
        record["error"] = None
        record["finish_reason"] = reply.finish_reason
        record["usage"] = usage
        record["cost_usd"] = usd_record(cost)
        record["attempts"] = parks or 1  # each batch that took it (the read-back is not one)
        record["latency_s"] = 0.0
        record["deployment"] = deployment.label
        record["model"] = deployment.model.removesuffix(BATCH_SUFFIX)
        record["tier"] = "batch"
        record["batch_id"] = line.batch_id
        record["cached"] = False
        record["request_hash"] = request_hash(line.sent)
        if added is not None:
            record["max_tokens_added"] = added
        record["metadata"] = dict(prepared.metadata)
        return record

    def _count(
        self, lines: list[_Line], counted: list[tuple[float | None, bool, str | None]], *, written: bool, stored: bool
    ) -> None:
        """The job's counters, as ``JobProgress.count`` counts a written Result (or, unwritten,
        where its answer is kept)."""
        progress = self._progress
        if not written:
            for line in lines:
                if stored:
                    progress.not_written += 1
                else:
                    progress.note_lost(line.item.line)
            return
        progress.written_back += len(lines)
        tally = progress.tiers.setdefault("batch", [0, 0.0])
        for cost, was_capped, reason in counted:
            progress.written += 1
            progress.succeeded += 1
            tally[0] += 1
            tally[1] += cost or 0.0
            if was_capped:
                progress.capped += 1
                if reason in ("length", "max_tokens"):
                    progress.cut_at_cap += 1


def _tier(route: Route) -> BatchTier:
    provider = route.provider
    assert isinstance(provider, BatchTier)
    return provider


def _cap_added(sent: Request, prepared: Request) -> int | None:
    """The output cap the engine set on a request that gave none (as ``max_tokens_added``)."""
    if sent.max_tokens is not None:
        return None
    if any(isinstance(sent.params.get(k), int) for k in ("max_tokens", "max_completion_tokens")):
        return None
    return prepared.max_tokens
