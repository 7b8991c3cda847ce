"""What a job's attempts add up to over time, per deployment and in all (the report's
figures), from the attempts as columns: a million attempts as a million objects took
longer to make than everything the report does with them."""

from __future__ import annotations

import bisect
import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from ._buckets import Buckets, histogram, percentile, rounded

__all__ = ["Columns", "Timeline", "over_time"]

#: Cooldown bands kept (merged where they overlap; beyond this, the longest).
_MAX_BANDS = 500

Limit = tuple[float, float | None, float | None, int | None, bool]


@dataclass(slots=True)
class Columns:
    """Attempts, one list per field (row ``i`` of each is attempt ``i``)."""

    started: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    deployment: list[str] = field(default_factory=list)
    #: Retries each stands for: 1 for an attempt after a request's first (0 for a first);
    #: from the results of an older state, its request's attempts but the last.
    retries: list[int] = field(default_factory=list)
    #: None for an answer, else the kind of failure.
    outcome: list[str | None] = field(default_factory=list)
    input_tokens: list[int] = field(default_factory=list)
    output_tokens: list[int] = field(default_factory=list)
    cost: list[float] = field(default_factory=list)
    ttft: list[float | None] = field(default_factory=list)


@dataclass(slots=True)
class Timeline:
    """Everything the state says happened: attempts, deployments, cooldowns, limits, runs."""

    source: str
    attempts: Columns = field(default_factory=Columns)
    deployments: dict[str, dict[str, Any]] = field(default_factory=dict)
    cooldowns: list[tuple[str, float, float, str]] = field(default_factory=list)
    limits: dict[str, list[Limit]] = field(default_factory=dict)
    runs: list[dict[str, Any]] = field(default_factory=list)


def over_time(timeline: Timeline, spent: float) -> dict[str, Any]:
    """The report's figures (``spent``: the state's dollars, of which the timeline may
    know only part)."""
    cols = timeline.attempts
    budget = timeline.runs[-1]["budget_usd"] if timeline.runs else None
    concurrency = timeline.runs[-1]["concurrency"] if timeline.runs else None
    if not cols.started:
        return {
            **{"attempts": _counts(cols), "time": None, "series": {}, "latency": _distribution([]), "ttft": None},
            **{"budget_usd": budget, "concurrency": None, "runs": timeline.runs, "deployments": [], "cost_by": {}},
            "cooldowns": [],
        }
    ended = [s + d for s, d in zip(cols.started, cols.seconds, strict=True)]
    start, end = min(cols.started), max(ended)
    buckets = Buckets(start, end)
    first, last = buckets.indices(cols.started), buckets.indices(ended)
    labels = list(dict.fromkeys([*timeline.deployments, *cols.deployment]))
    timeline.cooldowns = _as_they_ended(timeline.cooldowns, cols, end)
    series = _rates(buckets, cols, labels, first)
    series.update(_limit_series(buckets, timeline.limits, labels))
    series["in_flight_avg"], series["in_flight_peak"] = buckets.in_flight(cols.started, ended, first, last)
    latencies: list[list[float]] = [[] for _ in range(buckets.count)]
    firsts: list[list[float]] = [[] for _ in range(buckets.count)]
    for b, seconds, outcome, ttft in zip(last, cols.seconds, cols.outcome, cols.ttft, strict=True):
        if outcome is None:
            latencies[b].append(seconds)
            if ttft is not None:
                firsts[b].append(ttft)
    series["latency_p50"], series["latency_p90"], series["latency_p99"] = buckets.percentiles(latencies, (50, 90, 99))
    streamed = sorted(t for group in firsts for t in group)
    if streamed:
        series["ttft_p50"], series["ttft_p90"] = buckets.percentiles(firsts, (50, 90))
    series.update(_outcome_series(buckets, cols, first, last))
    series["cost_cumulative_usd"] = _cost_series(buckets, cols, last, spent)
    return {
        "attempts": _counts(cols),
        "time": {"start": start, "end": end, "bucket_seconds": buckets.width, "t": buckets.times},
        "series": series,
        "latency": _distribution(sorted(v for group in latencies for v in group)),
        "ttft": _distribution(streamed) if streamed else None,
        "budget_usd": budget,
        "concurrency": concurrency,
        "runs": timeline.runs,
        "deployments": _deployments(timeline, labels),
        "cost_by": _cost_by(timeline, labels),
        "cooldowns": _bands(timeline.cooldowns, buckets.width),
    }


def _rates(buckets: Buckets, cols: Columns, labels: list[str], first: list[int]) -> dict[str, Any]:
    """Requests sent per second and tokens per minute, per deployment, by when they were sent."""
    sent = {label: buckets.zeros() for label in labels}
    tokens = {label: buckets.zeros() for label in labels}
    for b, label, tokens_in, tokens_out in zip(
        first, cols.deployment, cols.input_tokens, cols.output_tokens, strict=True
    ):
        sent[label][b] += 1
        tokens[label][b] += tokens_in + tokens_out
    per_s, per_min = 1.0 / buckets.width, 60.0 / buckets.width
    return {
        "requests_per_s": {k: [rounded(v * per_s) for v in row] for k, row in sent.items()},
        "tokens_per_min": {k: [rounded(v * per_min) for v in row] for k, row in tokens.items()},
    }


def _limit_series(buckets: Buckets, limits: dict[str, list[Limit]], labels: list[str]) -> dict[str, Any]:
    """Each deployment's limit in force in each bucket (the last noted by its end), as
    requests per second and tokens per minute; None where it had none."""
    requests: dict[str, list[float | None]] = {}
    tokens: dict[str, list[float | None]] = {}
    for label in labels:
        rows = limits.get(label, [])
        if not any(r[1] is not None or r[2] is not None for r in rows):
            continue
        rpm_row: list[float | None] = []
        tpm_row: list[float | None] = []
        j = 0
        for t in buckets.times:
            while j + 1 < len(rows) and rows[j + 1][0] <= t + buckets.width:
                j += 1
            rpm, tpm = rows[j][1], rows[j][2]
            rpm_row.append(rounded(rpm / 60.0) if rpm is not None else None)
            tpm_row.append(rounded(tpm) if tpm is not None else None)
        requests[label], tokens[label] = rpm_row, tpm_row
    return {"limit_requests_per_s": requests, "limit_tokens_per_min": tokens}


def _outcome_series(buckets: Buckets, cols: Columns, first: list[int], last: list[int]) -> dict[str, Any]:
    """Answers, 429s and each kind of failure by when the attempt ended; retries by when sent."""
    answered, limited, retries = buckets.zeros(), buckets.zeros(), buckets.zeros()
    failed: dict[str, list[float]] = defaultdict(buckets.zeros)
    for b, outcome in zip(last, cols.outcome, strict=True):
        if outcome is None:
            answered[b] += 1
        elif outcome == "rate_limited":
            limited[b] += 1
        else:
            failed[outcome][b] += 1
    for b, count in zip(first, cols.retries, strict=True):
        if count:
            retries[b] += count
    return {"answered": answered, "rate_limited": limited, "retries": retries, "failed": dict(failed)}


def _cost_series(buckets: Buckets, cols: Columns, last: list[int], spent: float) -> list[float]:
    """Dollars spent by the end of each bucket. What the state counts beyond the timeline
    (runs before it was kept; attempts a crash left unsettled) is the starting point."""
    per = buckets.zeros()
    for b, cost in zip(last, cols.cost, strict=True):
        per[b] += cost
    before = spent - sum(per)
    running = before if before > max(1e-9, spent * 0.001) else 0.0
    out = []
    for value in per:
        running += value
        out.append(rounded(running, 6))
    return out


def _counts(cols: Columns) -> dict[str, Any]:
    kinds = Counter(outcome for outcome in cols.outcome if outcome is not None)
    return {
        "total": len(cols.outcome),
        "answered": len(cols.outcome) - sum(kinds.values()),
        "failed": sum(kinds.values()),
        "rate_limited": kinds.get("rate_limited", 0),
        "retries": sum(cols.retries),
        "by_kind": dict(kinds.most_common()),
    }


def _distribution(ordered: list[float]) -> dict[str, Any]:
    """Percentiles, the longest and a histogram of values sorted ascending."""
    result: dict[str, Any] = {"count": len(ordered)}
    for q in (50, 90, 99):
        found = percentile(ordered, q)
        result[f"p{q}"] = rounded(found) if found is not None else None
    result["max"] = rounded(ordered[-1]) if ordered else None
    result["histogram"] = histogram(ordered)
    return result


def _deployments(timeline: Timeline, labels: list[str]) -> list[dict[str, Any]]:
    cols = timeline.attempts
    tally = {label: [0, 0, 0, 0, 0.0] for label in labels}  # attempts, failed, 429s, tokens, dollars
    answered: dict[str, list[float]] = {label: [] for label in labels}
    rows = zip(
        cols.deployment, cols.outcome, cols.seconds, cols.input_tokens, cols.output_tokens, cols.cost, strict=True
    )
    for label, outcome, seconds, tokens_in, tokens_out, cost in rows:
        counts = tally[label]
        counts[0] += 1
        if outcome is None:
            answered[label].append(seconds)
        else:
            counts[1] += 1
            if outcome == "rate_limited":
                counts[2] += 1
        counts[3] += tokens_in + tokens_out
        counts[4] += cost
    cooled: dict[str, tuple[int, float]] = {}
    for label, start, end, _ in timeline.cooldowns:
        count, seconds = cooled.get(label, (0, 0.0))
        cooled[label] = (count + 1, seconds + max(0.0, end - start))
    total = max(1, len(cols.outcome))
    out = []
    for label in labels:
        attempts, failed, limited, tokens, cost = tally[label]
        mine = sorted(answered[label])
        info = timeline.deployments.get(label, {})
        noted = timeline.limits.get(label, [])
        count, seconds = cooled.get(label, (0, 0.0))
        out.append(
            {
                **{
                    "label": label,
                    "model": info.get("model"),
                    "tier": info.get("tier"),
                    "provider": info.get("provider"),
                },
                **{
                    "attempts": attempts,
                    "share": rounded(attempts / total, 3),
                    "answered": len(mine),
                    "failed": failed,
                },
                **{"rate_limited": limited, "tokens": tokens, "cost_usd": rounded(cost, 6)},
                "latency_p50": _rounded(percentile(mine, 50)),
                "latency_p99": _rounded(percentile(mine, 99)),
                "cooldowns": count,
                "cooled_seconds": rounded(seconds, 3),
                "limits": _limits_now(noted[-1] if noted else None, next((r for r in noted if not r[4]), None)),
            }
        )
    return out


def _rounded(value: float | None) -> float | None:
    return rounded(value) if value is not None else None


def _limits_now(last: Limit | None, configured: Limit | None) -> dict[str, Any] | None:
    """The limits last noted, and those configured (none: the deployment had none of its own)."""
    if last is None:
        return None
    first = configured or (0.0, None, None, None, False)
    return {
        "rpm": last[1],
        "tpm": last[2],
        "max_in_flight": last[3],
        "learnt": bool(last[4]),
        "configured": {"rpm": first[1], "tpm": first[2], "max_in_flight": first[3]},
    }


def _cost_by(timeline: Timeline, labels: list[str]) -> dict[str, dict[str, float]]:
    """Dollars by model, deployment and tier (every attempt's charge, failures included)."""
    by_deployment = dict.fromkeys(labels, 0.0)
    for label, cost in zip(timeline.attempts.deployment, timeline.attempts.cost, strict=True):
        by_deployment[label] += cost
    out: dict[str, dict[str, float]] = {"model": {}, "deployment": {}, "tier": {}}
    for label, cost in by_deployment.items():
        info = timeline.deployments.get(label, {})
        for name, key in (("deployment", label), ("model", info.get("model") or label), ("tier", info.get("tier"))):
            out[name][str(key or "sync")] = out[name].get(str(key or "sync"), 0.0) + cost
    return {
        name: {k: rounded(v, 6) for k, v in sorted(sums.items(), key=lambda kv: -kv[1])} for name, sums in out.items()
    }


def _as_they_ended(
    cooldowns: list[tuple[str, float, float, str]], cols: Columns, end: float
) -> list[tuple[str, float, float, str]]:
    """Cooldowns as they were, not as they were planned: one ends early when the
    deployment took an attempt again (its probe answered, a learnt pause was shorter),
    and none outlasts the job."""
    if not cooldowns:
        return []
    starts: dict[str, list[float]] = defaultdict(list)
    for label, started in zip(cols.deployment, cols.started, strict=True):
        starts[label].append(started)
    for values in starts.values():
        values.sort()
    out = []
    for label, start, planned, why in cooldowns:
        mine = starts.get(label, [])
        i = bisect.bisect_right(mine, start + 1e-6)
        ended = min(planned, end, mine[i] if i < len(mine) else math.inf)
        if ended > start:
            out.append((label, start, ended, why))
    return out


def _bands(cooldowns: list[tuple[str, float, float, str]], width: float) -> list[dict[str, Any]]:
    """Cooldowns as bands on the time axis: overlapping ones of a deployment merged (a
    burst of 429s is one band, counted), at most ``_MAX_BANDS`` (the longest kept)."""
    merged: list[dict[str, Any]] = []
    last: dict[str, dict[str, Any]] = {}
    gap = width / 10
    for label, start, end, why in sorted(cooldowns, key=lambda c: c[1]):
        band = last.get(label)
        if band is not None and start <= band["end"] + gap:
            band["end"] = max(band["end"], end)
            band["count"] += 1
            continue
        band = last[label] = {"deployment": label, "start": start, "end": end, "why": why, "count": 1}
        merged.append(band)
    if len(merged) > _MAX_BANDS:
        merged = sorted(sorted(merged, key=lambda b: b["start"] - b["end"])[:_MAX_BANDS], key=lambda b: b["start"])
    for band in merged:
        band["start"], band["end"] = round(band["start"], 3), round(band["end"], 3)
    return merged
