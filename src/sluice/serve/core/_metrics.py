"""``GET /metrics``: Prometheus text, from a registry of the server's own.

Counted as requests are served (per endpoint, client and deployment): requests and their
status, tokens, cost, refusals (429s sluice sends: queue full, wait too long, a client's
rate limit or budget), latency histograms (end to end, time waiting for capacity, time at
the provider, time to the first streamed token). Read from the engine when scraped (a
collector, so nothing is counted twice): the provider's 429s, retries, requests waiting
and in flight per deployment, the queue depth.

The registry is the server's own (not prometheus-client's global one), so two servers in
one process (tests) never share counters, and ``import sluice`` never imports
prometheus-client: this module is imported only when a server is built.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from ..._engine import Engine, RetryEvent
    from ..._models import Result
    from ...caching._groups import CacheCount

__all__ = ["CONTENT_TYPE", "Metrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class Metrics:
    """The server's counters and histograms; ``render()`` gives the exposition text."""

    def __init__(
        self,
        engine: Engine,
        queue_depth: Callable[[], int],
        client_spend: Callable[[], Mapping[str, tuple[float, float]]] | None = None,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "sluice_serve_requests", "Requests served, by endpoint, client and HTTP status",
            ["endpoint", "client", "status"], registry=r,
        )  # fmt: skip
        self.results = Counter(
            "sluice_serve_results", "Engine results of served requests, by client, deployment and outcome",
            ["client", "deployment", "outcome"], registry=r,
        )  # fmt: skip
        self.tokens = Counter(
            "sluice_serve_tokens", "Tokens of served requests as the provider reported them",
            ["client", "deployment", "kind"], registry=r,
        )  # fmt: skip
        self.cost = Counter(
            "sluice_serve_cost_usd", "US dollars spent on served requests", ["client", "deployment"], registry=r
        )
        self.cache_tokens = Counter(
            "sluice_serve_prompt_cache_tokens",
            "Prompt tokens of served requests as the provider billed them: uncached, written to its cache, read",
            ["client", "deployment", "kind"], registry=r,
        )  # fmt: skip
        self.cache_duplicates = Counter(
            "sluice_serve_prompt_cache_duplicate_writes",
            "Answers that wrote a prefix the prompt-cache plan expected them to read", ["client", "deployment"],
            registry=r,
        )  # fmt: skip
        self.cache_saved = Gauge(  # a gauge: a write's premium may cost more than it saved so far
            "sluice_serve_prompt_cache_saved_usd",
            "US dollars the providers' prompt caches saved against the same requests uncached (net of write premiums)",
            ["client", "deployment"], registry=r,
        )  # fmt: skip
        self.refused = Counter(
            "sluice_serve_refused", "429s sluice sent itself, by client and reason", ["client", "reason"], registry=r
        )
        self.retries = Counter(
            "sluice_serve_retries", "Retries the engine made, by deployment", ["deployment"], registry=r
        )
        self.duration = Histogram(
            "sluice_serve_request_duration_seconds", "Time from the request to the end of the response",
            ["endpoint", "client"], buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.queue_wait = Histogram(
            "sluice_serve_queue_wait_seconds", "Time a request waited for capacity (gate, budget and limiter)",
            ["deployment"], buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.upstream = Histogram(
            "sluice_serve_upstream_latency_seconds", "Time at the provider (last attempt)",
            ["deployment"], buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.first_token = Histogram(
            "sluice_serve_first_token_seconds", "Time to a stream's first token", ["deployment"],
            buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        r.register(_EngineCollector(engine, queue_depth, client_spend))

    def result(self, client: str, result: Result) -> None:
        """Count one engine result (answer or error)."""
        deployment = result.deployment or "-"
        outcome = "ok" if result.ok else (result.error.kind if result.error is not None else "error")
        self.results.labels(client, deployment, outcome).inc()
        usage = result.usage
        if usage.input_tokens:
            self.tokens.labels(client, deployment, "input").inc(usage.input_tokens)
        if usage.output_tokens:
            self.tokens.labels(client, deployment, "output").inc(usage.output_tokens)
        if result.cost_usd:
            self.cost.labels(client, deployment).inc(result.cost_usd)
        if result.attempts:
            timings = result.timings
            self.queue_wait.labels(deployment).observe(timings.queued + timings.limiter_wait)
            self.upstream.labels(deployment).observe(timings.latency)
            if timings.first_token is not None:
                self.first_token.labels(deployment).observe(timings.first_token)

    def prompt_cache(self, client: str, deployment: str, count: CacheCount) -> None:
        """Count one answer's prompt tokens as cached and uncached (see ``_prompt_cache``)."""
        for kind, tokens in (("uncached", count.uncached), ("written", count.written), ("read", count.read)):
            self.cache_tokens.labels(client, deployment, kind).inc(tokens)
        if count.duplicate:
            self.cache_duplicates.labels(client, deployment).inc()
        if count.saved_usd:
            self.cache_saved.labels(client, deployment).inc(count.saved_usd)

    def retry(self, event: RetryEvent) -> None:
        """``Engine(on_retry=...)``."""
        self.retries.labels(event.deployment).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _EngineCollector(Collector):
    """What the engine knows, read when scraped."""

    def __init__(
        self,
        engine: Engine,
        queue_depth: Callable[[], int],
        client_spend: Callable[[], Mapping[str, tuple[float, float]]] | None,
    ) -> None:
        self._engine = engine
        self._queue_depth = queue_depth
        self._client_spend = client_spend

    def collect(self) -> Iterator[Metric]:
        engine = self._engine
        if self._client_spend is not None:
            spent = GaugeMetricFamily(
                "sluice_client_spent_usd",
                "Dollars a client with a budget has spent (with --redis: over every replica, as Redis last said)",
                labels=["client"],
            )
            limit = GaugeMetricFamily("sluice_client_budget_usd", "A client's budget_usd", labels=["client"])
            for name, (usd, cap) in sorted(self._client_spend().items()):
                spent.add_metric([name], usd)
                limit.add_metric([name], cap)
            yield spent
            yield limit
        depth = GaugeMetricFamily("sluice_serve_queue_depth", "Served requests waiting for capacity now")
        depth.add_metric([], self._queue_depth())
        yield depth
        limited = CounterMetricFamily(
            "sluice_upstream_rate_limited", "429s the providers sent, by deployment", labels=["deployment"]
        )
        waiting = GaugeMetricFamily(
            "sluice_deployment_waiting", "Requests waiting on a deployment's limiter (all lanes)", labels=["deployment"]
        )
        in_flight = GaugeMetricFamily("sluice_deployment_in_flight", "Requests at the provider", labels=["deployment"])
        cooling = GaugeMetricFamily(
            "sluice_deployment_cooling_seconds", "Seconds left of a deployment's cooldown", labels=["deployment"]
        )
        for route in engine.router.routes:
            label = route.deployment.label
            limiter = route.limiter
            penalties = getattr(limiter, "penalties", None)  # a ServeLimiter or ServeRedisLimiter
            if penalties is not None:
                limited.add_metric([label], penalties)
                waiting.add_metric([label], getattr(limiter, "waiting", 0))
            in_flight.add_metric([label], float(getattr(limiter, "in_flight", 0)))
        for status in engine.deployment_status():
            cooling.add_metric([status.deployment], status.seconds_left)
        yield limited
        yield waiting
        yield in_flight
        yield cooling
        stats = engine.stats
        for name, value, doc in (
            ("sluice_engine_attempts", stats.attempts, "Attempts the engine sent (all work)"),
            ("sluice_engine_retries", stats.retries, "Retries the engine made (all work)"),
            ("sluice_engine_rate_limited", stats.rate_limited, "429s the engine met (all work)"),
            ("sluice_engine_cost_usd", stats.cost_usd, "US dollars for answers (all work)"),
        ):
            family = CounterMetricFamily(name, doc)
            family.add_metric([], value)
            yield family
