"""What ``/dashboard/data`` says: the server's state now, its last ten minutes, its last errors.

All of it is read from what the server keeps anyway (each engine's router, limiters and
stats, the admission queue, the clients' budgets, the Prometheus counters, the Batch API's
rows); nothing is added to a request's way but one append to a bounded ring per error.
A sample of the running totals is taken every :data:`SAMPLE_EVERY` seconds into a ring of
:data:`HISTORY` (the charts' rates are the differences between two samples). The JSON is
made at most once per sample (:meth:`Live.data`), by the first poll after it, and shared by
every tab and script that polls: its cost is one pass over the counters' series and one
over the clients, whoever watches. A request refused for a wrong or missing key (401) is
counted, not noted: a stranger's flood must not push the real errors out of the ring.

Everything here is shown to the admin only, and still: error messages are scrubbed of
upstream URLs and hosts like a client's errors, and no key, digest or URL appears.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from ... import __version__
from ..core._errors import plain

if TYPE_CHECKING:
    from prometheus_client import Counter as PromCounter

    from ..._engine import Engine, RetryEvent
    from ..._router import Route
    from ..core._context import ServeContext

__all__ = ["ERRORS", "HISTORY", "RECENT", "SAMPLE_EVERY", "Live", "Recent"]

_log = logging.getLogger("sluice.serve")

SAMPLE_EVERY = 2.0
HISTORY = 300  # ten minutes of samples
ERRORS = 50
#: Batches listed (newest first).
BATCHES = 20
#: The longest error message kept.
_MESSAGE = 300


@dataclass(frozen=True, slots=True)
class _Note:
    at: float
    source: str  # "client": the server answered a client with an error; "upstream": an attempt failed, retried
    client: str | None
    deployment: str | None
    status: int | None
    kind: str
    message: str


class Recent:
    """The last :data:`ERRORS` errors, newest last, none of them past its share.

    Bounded, like a ring, but when it is full the note that goes is the oldest of whoever
    holds the most (a client, for what the server answered it; a deployment, for its
    retried attempts), not the oldest of all: one client's flood of its own 4xx pushes out
    only its own notes, and no one keeps less than an even share of the list.

    ``app[RECENT]`` when the dashboard is on: the error middleware adds what it answers."""

    __slots__ = ("notes", "size", "unauthenticated", "unauthenticated_at")

    def __init__(self, size: int = ERRORS) -> None:
        self.size = size
        self.notes: deque[_Note] = deque()
        #: Requests refused for a wrong or missing key (401): counted, never in the ring.
        self.unauthenticated = 0
        self.unauthenticated_at: float | None = None

    def answered(self, client: str | None, response: web.StreamResponse) -> None:
        """A 4xx or 5xx the server sent (its message from the OpenAI-shaped body)."""
        if response.status == 401 and client is None:
            self.unauthenticated += 1
            self.unauthenticated_at = time.time()
            return
        kind, message = f"http_{response.status}", ""
        body = getattr(response, "body", None)
        if isinstance(body, bytes) and body[:1] == b"{":
            try:
                error = orjson.loads(body).get("error") or {}
            except (orjson.JSONDecodeError, AttributeError):
                error = {}
            if isinstance(error, dict):
                kind = str(error.get("code") or error.get("type") or kind)
                message = str(error.get("message") or "")
        self._add(_Note(time.time(), "client", client, None, response.status, kind, message[:_MESSAGE]))

    def retried(self, event: RetryEvent) -> None:
        """An attempt that failed and goes again (``Engine(on_retry=...)``)."""
        error = event.error
        status = getattr(error, "status", None)
        self._add(_Note(time.time(), "upstream", None, event.deployment, status, error.kind, error.message[:_MESSAGE]))

    def _add(self, note: _Note) -> None:
        notes = self.notes
        if len(notes) >= self.size:
            held = Counter(_whose(n) for n in notes)
            most = max(held.values())
            newcomer = _whose(note)
            # the newcomer's own go first when it is among those that hold the most
            loser = newcomer if held[newcomer] == most else next(w for w in map(_whose, notes) if held[w] == most)
            del notes[next(i for i, n in enumerate(notes) if _whose(n) == loser)]
        notes.append(note)


def _whose(note: _Note) -> tuple[str, str | None]:
    """Whose share of the error list a note counts against."""
    return (note.source, note.client if note.source == "client" else note.deployment)


RECENT: web.AppKey[Recent] = web.AppKey("sluice.dashboard.recent", Recent)


@dataclass(frozen=True, slots=True)
class _Sample:
    at: float
    succeeded: int
    failed: int
    rate_limited: int
    retries: int
    tokens: int
    spent: float
    in_flight: int
    waiting: int
    requests: Mapping[str, float]  # per client: engine results so far


class Live:
    """The dashboard's view of one server (see the module docstring)."""

    def __init__(
        self,
        ctx: ServeContext,
        recent: Recent,
        *,
        engines: Callable[[], list[Engine]],
        client_spend: Callable[[], Mapping[str, tuple[float, float]]],
        batches: Callable[[int], list[tuple[str, dict[str, Any]]]],
        replica: Callable[[], str | None] = lambda: None,
    ) -> None:
        self.ctx = ctx
        self.recent = recent
        self.engines = engines
        self.client_spend = client_spend
        self.batches = batches
        self.replica = replica
        self.started = time.time()
        self.samples: deque[_Sample] = deque(maxlen=HISTORY)
        #: Samples taken (or tried): the JSON shared by the polls is made once per tick.
        self.ticks = 0
        self._shared: tuple[int, bytes] | None = None

    # -- samples ------------------------------------------------------------------------------

    async def run(self) -> None:
        """Sample every :data:`SAMPLE_EVERY` seconds until cancelled."""
        while True:
            try:
                self.sample()
            except Exception:  # a sample must never take the server down
                _log.exception("sluice serve: the dashboard could not take a sample")
            await asyncio.sleep(SAMPLE_EVERY)

    def sample(self) -> None:
        self.ticks += 1
        self.samples.append(self._measure())

    def _measure(self) -> _Sample:
        engines = self.engines()
        routes = [route for engine in engines for route in engine.router.routes]
        stats = [engine.stats for engine in engines]
        return _Sample(
            at=time.time(),
            succeeded=sum(s.succeeded for s in stats),
            failed=sum(s.failed for s in stats),
            rate_limited=sum(s.rate_limited for s in stats),
            retries=sum(s.retries for s in stats),
            tokens=sum(s.input_tokens + s.output_tokens for s in stats),
            spent=self._spent(engines),
            in_flight=sum(_in_flight(r) for r in routes),
            waiting=self.ctx.admission.waiting,
            requests=_by_client(self.ctx.metrics.results),
        )

    @staticmethod
    def _spent(engines: list[Engine]) -> float:
        return float(engines[0].spent()) if engines else 0.0  # the batch engine spends the same money

    # -- the snapshot -------------------------------------------------------------------------

    def data(self) -> bytes:
        """The snapshot as JSON, made by the first poll after each sample and shared by the
        rest until the next (so it is at most :data:`SAMPLE_EVERY` seconds old)."""
        shared = self._shared
        if shared is None or shared[0] != self.ticks:
            shared = self._shared = (self.ticks, orjson.dumps(self.snapshot()))
        return shared[1]

    def snapshot(self) -> dict[str, Any]:
        """Everything the page shows, as JSON-ready values (the charts end now, not at the last tick)."""
        now = self._measure()
        if not self.samples:
            self.samples.append(now)
        engines = self.engines()
        return {
            "server": self._server(engines, now),
            "totals": _totals(engines),
            "prompt_cache": self._prompt_cache(),
            "deployments": [self._deployment(route) for engine in engines for route in engine.router.routes],
            "clients": self._clients(now),
            "queue": self._queue(engines),
            "batches": [_batch(client, batch) for client, batch in self.batches(BATCHES)],
            "errors": [self._note(n) for n in reversed(self.recent.notes)],
            "unauthenticated": {"count": self.recent.unauthenticated, "last_at": self.recent.unauthenticated_at},
            "series": self._series([*self.samples, now] if now.at > self.samples[-1].at else list(self.samples)),
            "poll_s": SAMPLE_EVERY,
        }

    def _server(self, engines: list[Engine], now_sample: _Sample) -> dict[str, Any]:
        ctx = self.ctx
        now = time.time()
        problem = ctx.redis.problem if ctx.redis is not None else None
        stopped = any(engine.store_error is not None for engine in engines)
        budget = ctx.clients.engine_budget
        return {
            "version": __version__,
            "replica": self.replica(),
            "started_at": self.started,
            "now": now,
            "uptime_s": now - self.started,
            "status": "stopped" if stopped else "redis_down" if problem is not None else "ok",
            "problem": ctx.scrub(problem) if problem else None,
            "budget_usd": None if budget is None else budget.limit,
            "spent_usd": now_sample.spent,
        }

    def _prompt_cache(self) -> dict[str, Any]:
        """The prompt tokens answers read, wrote and sent uncached, as ``/metrics`` counts them."""
        metrics = self.ctx.metrics
        tokens = _totals_by(metrics.cache_tokens, ("kind",))
        figures: dict[str, Any] = {
            f"{kind}_tokens": int(tokens.get((kind,), 0)) for kind in ("uncached", "written", "read")
        }
        figures["duplicate_writes"] = int(sum(_totals_by(metrics.cache_duplicates, ()).values()))
        saved = sum(sample.value for metric in metrics.cache_saved.collect() for sample in metric.samples)
        figures["saved_usd"] = round(saved, 6)
        return figures

    def _deployment(self, route: Route) -> dict[str, Any]:
        deployment, limiter, health = route.deployment, route.limiter, route.health
        loop = asyncio.get_running_loop()
        cooling = max(0.0, health.cooling(loop.time()))
        paused = limiter.paused_for() if callable(getattr(limiter, "paused_for", None)) else 0.0  # type: ignore[attr-defined]
        state = "cooling down" if cooling > 0 else "probing" if health.probing else "paused (429)" if paused else "ok"
        window = float(getattr(limiter, "window", deployment.window) or 60.0)
        effective = {
            "rpm": _per_minute(getattr(limiter, "requests_limit", None), window),
            "tpm": _per_minute(getattr(limiter, "tokens_limit", None), window),
            "itpm": _per_minute(getattr(limiter, "input_limit", None), window),
            "otpm": _per_minute(getattr(limiter, "output_limit", None), window),
            "max_in_flight": getattr(limiter, "max_in_flight", None),
        }
        configured = {
            "rpm": _per_minute(deployment.rpm, deployment.window),
            "tpm": _per_minute(deployment.tpm, deployment.window),
            "itpm": _per_minute(deployment.itpm, deployment.window),
            "otpm": _per_minute(deployment.otpm, deployment.window),
            "max_in_flight": deployment.max_in_flight,
        }
        learnt = [k for k, v in effective.items() if v is not None and v != configured[k]]
        why = None
        if health.last_error is not None and (state != "ok" or route.failed):
            why = f"{health.last_error}: {self.ctx.scrub(health.last_message or '')}"[:_MESSAGE]
        return {
            "name": route.label,
            "model": deployment.model,
            "provider": deployment.provider_name,
            "tier": deployment.tier,
            "state": state,
            "cooling_s": round(cooling, 1),
            "paused_s": round(paused, 1),
            "why": why,
            "configured": configured,
            "effective": effective,
            "learnt": learnt,
            "adaptive": route.adaptive is not None
            and deployment.max_in_flight is None
            and effective["max_in_flight"] is not None,
            "in_flight": _in_flight(route),
            "waiting": int(getattr(limiter, "waiting", 0)),
            "answered": route.answered,
            "failed": route.failed,
            "rate_limited": int(getattr(limiter, "penalties", 0)),
        }

    def _clients(self, now_sample: _Sample) -> list[dict[str, Any]]:
        metrics = self.ctx.metrics
        # each counter read once, grouped by client: O(series + clients), never their product
        results = _by_client_and(metrics.results, "outcome")
        refused = _by_client_and(metrics.refused, "reason")
        cost = _by_client(metrics.cost)
        tokens = _by_client(metrics.tokens)
        spend = self.client_spend()
        minute = self._minute_ago()
        rows = []
        for name, client in sorted(self.ctx.clients.by_name.items()):
            budget = client.budget
            spent, limit = spend.get(name, (budget.spent(), budget.limit) if budget is not None else (None, None))
            done = results.get(name, {})
            limiter = client.limiter
            rows.append(
                {
                    "name": name,
                    "budget_usd": limit,
                    "spent_usd": spent,
                    "held_usd": budget.reserved() if budget is not None else None,
                    "rpm": getattr(limiter, "requests_limit", None),
                    "tpm": getattr(limiter, "tokens_limit", None),
                    "models": sorted(client.models) if client.models is not None else None,
                    "requests": int(sum(done.values())),
                    "errors": int(sum(n for outcome, n in done.items() if outcome != "ok")),
                    "per_min": _rate(name, minute, now_sample),
                    "refused": {reason: int(n) for reason, n in sorted(refused.get(name, {}).items())},
                    "tokens": int(tokens.get(name, 0)),
                    "cost_usd": cost.get(name, 0.0),
                }
            )
        return rows

    def _minute_ago(self) -> _Sample | None:
        """The oldest sample of the last minute (a client's rate is counted from it)."""
        now = time.time()
        for sample in self.samples:
            if now - sample.at <= 60:
                return sample
        return None

    def _queue(self, engines: list[Engine]) -> dict[str, Any]:
        admission = self.ctx.admission
        gates = [engine.runtime.gate for engine in engines]
        return {
            "waiting": admission.waiting,
            "max_queue": admission.max_queue,
            "max_wait_s": admission.max_wait,
            "engine_held": sum(g.held for g in gates),
            "engine_capacity": sum(g.capacity for g in gates),
            "engine_waiting": sum(g.waiting for g in gates),
            "limiter_waiting": sum(
                int(getattr(r.limiter, "waiting", 0)) for engine in engines for r in engine.router.routes
            ),
        }

    def _note(self, note: _Note) -> dict[str, Any]:
        return {
            "at": note.at,
            "source": note.source,
            "client": note.client,
            "deployment": note.deployment,
            "status": note.status,
            "kind": note.kind,
            "message": self.ctx.scrub(note.message),
        }

    @staticmethod
    def _series(samples: list[_Sample]) -> dict[str, list[float]]:
        series: dict[str, list[float]] = {
            "t": [],
            "answered_per_s": [],
            "failed_per_s": [],
            "rate_limited_per_s": [],
            "retries_per_s": [],
            "tokens_per_min": [],
            "in_flight": [],
            "waiting": [],
            "spent_usd": [],
        }
        for i, after in enumerate(samples[1:], 1):
            # the last point is taken by a poll, maybe moments after a tick: its rates are
            # over the tick before too (a rate over a sliver of a second is noise)
            before = samples[i - 2] if i >= 2 and after.at - samples[i - 1].at < SAMPLE_EVERY / 2 else samples[i - 1]
            seconds = max(after.at - before.at, 1e-9)
            series["t"].append(round(after.at, 3))
            series["answered_per_s"].append(round((after.succeeded - before.succeeded) / seconds, 3))
            series["failed_per_s"].append(round((after.failed - before.failed) / seconds, 3))
            series["rate_limited_per_s"].append(round((after.rate_limited - before.rate_limited) / seconds, 3))
            series["retries_per_s"].append(round((after.retries - before.retries) / seconds, 3))
            series["tokens_per_min"].append(round((after.tokens - before.tokens) * 60 / seconds, 1))
            series["in_flight"].append(after.in_flight)
            series["waiting"].append(after.waiting)
            series["spent_usd"].append(round(after.spent, 6))
        return series


def _rate(client: str, since: _Sample | None, now: _Sample) -> float | None:
    """A client's engine results per minute, from ``since`` to ``now`` (None: not known yet)."""
    if since is None or now.at - since.at < 1.0:
        return None
    return round((now.requests.get(client, 0) - since.requests.get(client, 0)) * 60 / (now.at - since.at), 2)


def _totals(engines: Iterable[Engine]) -> dict[str, Any]:
    found: Counter[str] = Counter()
    cost = 0.0
    maybe = 0.0
    for engine in engines:
        stats = engine.stats
        for name in ("submitted", "succeeded", "failed", "cancelled", "cached", "attempts", "retries"):
            found[name] += getattr(stats, name)
        found["rate_limited"] += stats.rate_limited
        found["input_tokens"] += stats.input_tokens
        found["output_tokens"] += stats.output_tokens
        cost += stats.cost_usd
        maybe += stats.maybe_billed_usd
    latency = next(iter(engines), None)
    p50 = latency.stats.latency.percentile(50) if latency is not None else None
    p95 = latency.stats.latency.percentile(95) if latency is not None else None
    return {**found, "cost_usd": cost, "maybe_billed_usd": maybe, "latency_p50_s": p50, "latency_p95_s": p95}


def _batch(client: str, batch: Mapping[str, Any]) -> dict[str, Any]:
    counts = batch.get("request_counts") or {}
    return {
        "id": batch.get("id"),
        "client": client,
        "status": batch.get("status"),
        "endpoint": batch.get("endpoint"),
        "model": plain(str(batch["model"])) if batch.get("model") is not None else None,
        "total": counts.get("total", 0),
        "completed": counts.get("completed", 0),
        "failed": counts.get("failed", 0),
        "created_at": batch.get("created_at"),
    }


def _in_flight(route: Route) -> int:
    return int(getattr(route.limiter, "in_flight", 0))


def _per_minute(limit: float | None, window: float) -> float | None:
    return None if limit is None else round(limit * 60.0 / window, 3)


def _totals_by(counter: PromCounter, labels: tuple[str, ...]) -> dict[tuple[str, ...], float]:
    """A Prometheus counter's totals, added up by ``labels`` (read as a scrape reads it)."""
    found: dict[tuple[str, ...], float] = {}
    for metric in counter.collect():
        for sample in metric.samples:
            if sample.name.endswith("_total"):
                key = tuple(sample.labels.get(label, "") for label in labels)
                found[key] = found.get(key, 0.0) + sample.value
    return found


def _by_client(counter: PromCounter) -> dict[str, float]:
    return {key[0]: value for key, value in _totals_by(counter, ("client",)).items()}


def _by_client_and(counter: PromCounter, label: str) -> dict[str, dict[str, float]]:
    """A counter's totals by client, then by ``label`` (one pass over its series)."""
    found: dict[str, dict[str, float]] = {}
    for (client, value), total in _totals_by(counter, ("client", label)).items():
        found.setdefault(client, {})[value] = total
    return found
