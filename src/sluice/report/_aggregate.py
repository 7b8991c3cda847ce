"""A job's report as plain data: what ``sluice report --json`` prints and the HTML plots.

Made from the state file alone (and the output, for the lines it names): its timeline
when it has one (every attempt, cooldown and limit, see :mod:`sluice.store._timeline`),
else its results, one per request, which tell less (no retried 429, no cooldown, the
last attempt's latency only; ``source`` says which). Everything over time is in
:class:`~._buckets.Buckets`, so the report's size does not grow with the job.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._stats import LatencyHistogram
from ..batch._report import job_status
from ..store import SqliteStore
from ._buckets import Buckets, histogram, rounded
from ._lines import from_output, from_state

__all__ = ["FORMAT", "build_report"]

#: The version of the report's JSON layout (``sluice report --json``).
FORMAT = 1
#: Cooldown bands kept (merged where they overlap; beyond this, the longest).
_MAX_BANDS = 500


@dataclass(slots=True)
class _Attempt:
    started: float
    seconds: float
    deployment: str
    #: Retries it stands for: 1 for an attempt after the first (0 for a first); from the
    #: results of an older state, its request's attempts but the last.
    retries: int
    outcome: str | None
    status: int | None
    input_tokens: int
    output_tokens: int
    cost: float
    ttft: float | None

    @property
    def ended(self) -> float:
        return self.started + self.seconds


@dataclass(slots=True)
class _Timeline:
    source: str
    attempts: list[_Attempt] = field(default_factory=list)
    deployments: dict[str, dict[str, Any]] = field(default_factory=dict)
    cooldowns: list[tuple[str, float, float, str]] = field(default_factory=list)
    limits: dict[str, list[tuple[float, float | None, float | None, int | None, bool]]] = field(default_factory=dict)
    runs: list[dict[str, Any]] = field(default_factory=list)


def build_report(state: Path, output: Path | None = None, *, top: int = 20) -> dict[str, Any]:
    """The report of the job whose state is ``state`` (``output``: its output file, for
    the lines it names; None or missing: the state's results name them by key)."""
    store = SqliteStore(state, readonly=True)
    try:
        meta = store.meta()
        summary = store.summary()
        timeline = _read_timeline(store)
        lines = from_output(output, top) if output is not None and output.is_file() else None
        if lines is None:
            lines = from_state(store, top, int(summary["failed"]))
    finally:
        store.close()
    report: dict[str, Any] = {"format": FORMAT, "source": timeline.source, "job": _job(state, meta, summary)}
    report["records"] = _records(meta, summary, lines)
    report.update(_over_time(timeline, summary))
    budget = report.pop("budget_usd", None)
    if report["job"]["budget_usd"] is None:
        report["job"]["budget_usd"] = budget  # the last run's (the state's notes have none)
    report["lines"] = lines
    return report


# -- reading -----------------------------------------------------------------------------


def _read_timeline(store: SqliteStore) -> _Timeline:
    if store.has_timeline():
        timeline = _Timeline("timeline")
        labels: dict[int, str] = {}
        for row_id, label, model, tier, provider in store.report_rows("deployments"):
            labels[row_id] = label
            timeline.deployments[label] = {"model": model, "tier": tier, "provider": provider}
        for started, seconds, dep, number, outcome, status, tin, tout, cost, ttft in store.report_rows("attempts"):
            timeline.attempts.append(
                _Attempt(
                    started, seconds, labels.get(dep, "?"), int(number > 1), outcome, status, tin, tout, cost, ttft
                )
            )
        for dep, started, ended, why in store.report_rows("cooldowns"):
            timeline.cooldowns.append((labels.get(dep, "?"), started, ended, why))
        for at, dep, rpm, tpm, in_flight, learnt in store.report_rows("limits"):
            timeline.limits.setdefault(labels.get(dep, "?"), []).append((at, rpm, tpm, in_flight, bool(learnt)))
        for started, pid, concurrency, budget in store.report_rows("runs"):
            timeline.runs.append({"start": started, "pid": pid, "concurrency": concurrency, "budget_usd": budget})
        if timeline.attempts:
            return timeline
        from_results = _from_results(store)  # a job whose workers kept none (--redis)
        return from_results if from_results.attempts else timeline
    return _from_results(store)


def _from_results(store: SqliteStore) -> _Timeline:
    """A state from before the timeline: each result as its last attempt (its earlier
    attempts are counted as retries at its start, their outcomes unknown)."""
    timeline = _Timeline("results")
    for started, seconds, label, model, tier, attempts, ok, kind, status, tin, tout, cost in store.report_rows(
        "results"
    ):
        label = str(label or model or "?")
        timeline.deployments.setdefault(label, {"model": model, "tier": tier, "provider": None})
        retries = max(0, int(attempts or 1) - 1)
        outcome = None if ok else str(kind or "error")
        timeline.attempts.append(
            _Attempt(float(started), float(seconds), label, retries, outcome, status, tin, tout, float(cost), None)
        )
    return timeline


# -- what the job is ---------------------------------------------------------------------


def _job(state: Path, meta: dict[str, Any], summary: dict[str, Any]) -> dict[str, Any]:
    budget = meta.get("budget_usd")
    return {
        "state": str(state),
        "input": meta.get("input"),
        "output": meta.get("output"),
        "status": job_status(meta),
        "started_at": meta.get("started_at"),
        "finished_at": meta.get("finished_at") if meta.get("status") != "running" else None,
        "runs": meta.get("runs"),
        "budget_usd": budget if isinstance(budget, (int, float)) else None,
        "cost_usd": rounded(summary["cost_usd"], 6) if summary["cost_usd"] is not None else None,
        "input_tokens": summary["input_tokens"],
        "output_tokens": summary["output_tokens"],
    }


def _records(meta: dict[str, Any], summary: dict[str, Any], lines: dict[str, Any]) -> dict[str, Any]:
    """The job's records: counted in its output when it was read, else as the state has them."""
    total = meta.get("total")
    counted = lines.get("counted") or {"records": meta.get("written")}
    return {
        "in_input": total if isinstance(total, int) else None,
        "written": counted["records"],
        "stored": summary["results"],
        "succeeded": counted.get("succeeded", summary["succeeded"]),
        "failed": counted.get("failed", summary["failed"]),
        "errors": lines.get("errors", dict(summary["errors"])),
    }


# -- over time ------------------------------------------------------------------------------


def _over_time(timeline: _Timeline, summary: dict[str, Any]) -> dict[str, Any]:
    attempts = timeline.attempts
    budget = timeline.runs[-1]["budget_usd"] if timeline.runs else None
    if not attempts:
        return {
            "attempts": _attempt_counts([]),
            "time": None,
            "series": {},
            "latency": _distribution([]),
            "ttft": None,
            "budget_usd": budget,
            "concurrency": None,
            "runs": timeline.runs,
            "deployments": [],
            "cost_by": {},
            "cooldowns": [],
        }
    start = min(a.started for a in attempts)
    end = max(a.ended for a in attempts)
    buckets = Buckets(start, end)
    timeline.cooldowns = _as_they_ended(timeline.cooldowns, attempts, end)
    labels = list(dict.fromkeys([*timeline.deployments, *(a.deployment for a in attempts)]))
    series = _rates(buckets, attempts, labels)
    series.update(_limit_series(buckets, timeline.limits, labels))
    average, peak = buckets.in_flight((a.started, a.ended) for a in attempts)
    series["in_flight_avg"], series["in_flight_peak"] = average, peak
    answered = [a for a in attempts if a.outcome is None]
    p50, p90, p99 = buckets.percentiles(((a.ended, a.seconds) for a in answered), (50, 90, 99))
    series["latency_p50"], series["latency_p90"], series["latency_p99"] = p50, p90, p99
    streamed = [a for a in answered if a.ttft is not None]
    if streamed:
        t50, t90 = buckets.percentiles(((a.started + (a.ttft or 0), a.ttft or 0) for a in streamed), (50, 90))
        series["ttft_p50"], series["ttft_p90"] = t50, t90
    series.update(_outcome_series(buckets, attempts))
    series["cost_cumulative_usd"] = _cost_series(buckets, attempts, summary)
    return {
        "attempts": _attempt_counts(attempts),
        "time": {"start": start, "end": end, "bucket_seconds": buckets.width, "t": buckets.times},
        "series": series,
        "latency": _distribution([a.seconds for a in answered]),
        "ttft": _distribution([a.ttft for a in streamed if a.ttft is not None]) if streamed else None,
        "budget_usd": budget,
        "concurrency": timeline.runs[-1]["concurrency"] if timeline.runs else None,
        "runs": timeline.runs,
        "deployments": _deployments(timeline, labels, attempts),
        "cost_by": _cost_by(timeline, attempts),
        "cooldowns": _bands(timeline.cooldowns, buckets.width),
    }


def _rates(buckets: Buckets, attempts: Sequence[_Attempt], labels: list[str]) -> dict[str, Any]:
    """Requests sent per second and tokens per minute, per deployment, by when they were sent."""
    sent = {label: buckets.zeros() for label in labels}
    tokens = {label: buckets.zeros() for label in labels}
    for a in attempts:
        i = buckets.index(a.started)
        sent[a.deployment][i] += 1
        tokens[a.deployment][i] += a.input_tokens + a.output_tokens
    per_s, per_min = 1.0 / buckets.width, 60.0 / buckets.width
    return {
        "requests_per_s": {k: [rounded(v * per_s) for v in row] for k, row in sent.items()},
        "tokens_per_min": {k: [rounded(v * per_min) for v in row] for k, row in tokens.items()},
    }


def _limit_series(
    buckets: Buckets,
    limits: dict[str, list[tuple[float, float | None, float | None, int | None, bool]]],
    labels: list[str],
) -> dict[str, Any]:
    """Each deployment's limit in force in each bucket (the last noted by its end), as
    requests per second and tokens per minute; None where it had none."""
    requests: dict[str, list[float | None]] = {}
    tokens: dict[str, list[float | None]] = {}
    times = buckets.times
    for label in labels:
        rows = limits.get(label, [])
        if not any(r[1] is not None or r[2] is not None for r in rows):
            continue
        rpm_row: list[float | None] = []
        tpm_row: list[float | None] = []
        j = 0
        for t in times:
            while j + 1 < len(rows) and rows[j + 1][0] <= t + buckets.width:
                j += 1
            rpm, tpm = rows[j][1], rows[j][2]
            rpm_row.append(rounded(rpm / 60.0) if rpm is not None else None)
            tpm_row.append(rounded(tpm) if tpm is not None else None)
        requests[label], tokens[label] = rpm_row, tpm_row
    return {"limit_requests_per_s": requests, "limit_tokens_per_min": tokens}


def _outcome_series(buckets: Buckets, attempts: Sequence[_Attempt]) -> dict[str, Any]:
    """Answers, 429s and each kind of failure by when the attempt ended; retries by when sent."""
    answered, limited, retries = buckets.zeros(), buckets.zeros(), buckets.zeros()
    failed: dict[str, list[float]] = defaultdict(buckets.zeros)
    for a in attempts:
        i = buckets.index(a.ended)
        if a.outcome is None:
            answered[i] += 1
        elif a.outcome == "rate_limited":
            limited[i] += 1
        else:
            failed[a.outcome][i] += 1
        if a.retries:
            retries[buckets.index(a.started)] += a.retries
    return {"answered": answered, "rate_limited": limited, "retries": retries, "failed": dict(failed)}


def _cost_series(buckets: Buckets, attempts: Sequence[_Attempt], summary: dict[str, Any]) -> list[float]:
    """Dollars spent by the end of each bucket. What the state counts beyond the timeline
    (runs before it was kept; attempts a crash left unsettled) is the starting point."""
    per = buckets.zeros()
    for a in attempts:
        per[buckets.index(a.ended)] += a.cost
    total = float(summary["cost_usd"] or 0.0)
    before = total - sum(per)
    running = before if before > max(1e-9, total * 0.001) else 0.0
    out = []
    for value in per:
        running += value
        out.append(rounded(running, 6))
    return out


# -- totals ---------------------------------------------------------------------------------


def _attempt_counts(attempts: Sequence[_Attempt]) -> dict[str, Any]:
    kinds = Counter(a.outcome for a in attempts if a.outcome is not None)
    return {
        "total": len(attempts),
        "answered": sum(1 for a in attempts if a.outcome is None),
        "failed": sum(kinds.values()),
        "rate_limited": kinds.get("rate_limited", 0),
        "retries": sum(a.retries for a in attempts),
        "by_kind": dict(kinds.most_common()),
    }


def _distribution(values: list[float]) -> dict[str, Any]:
    hist = LatencyHistogram()
    for value in values:
        hist.add(value)
    result: dict[str, Any] = {"count": len(values)}
    for q in (50, 90, 99):
        found = hist.percentile(q)
        result[f"p{q}"] = rounded(found) if found is not None else None
    result["max"] = rounded(max(values)) if values else None
    result["histogram"] = histogram(values)
    return result


def _deployments(timeline: _Timeline, labels: list[str], attempts: Sequence[_Attempt]) -> list[dict[str, Any]]:
    by: dict[str, list[_Attempt]] = defaultdict(list)
    for a in attempts:
        by[a.deployment].append(a)
    total = max(1, len(attempts))
    cooled: dict[str, tuple[int, float]] = {}
    for label, start, end, _ in timeline.cooldowns:
        count, seconds = cooled.get(label, (0, 0.0))
        cooled[label] = (count + 1, seconds + max(0.0, end - start))
    rows = []
    for label in labels:
        mine = by.get(label, [])
        info = timeline.deployments.get(label, {})
        answered = [a.seconds for a in mine if a.outcome is None]
        latency = _distribution(answered)
        noted = timeline.limits.get(label, [])
        last = noted[-1] if noted else None
        count, seconds = cooled.get(label, (0, 0.0))
        rows.append(
            {
                "label": label,
                "model": info.get("model"),
                "tier": info.get("tier"),
                "provider": info.get("provider"),
                "attempts": len(mine),
                "share": rounded(len(mine) / total, 3),
                "answered": len(answered),
                "failed": sum(1 for a in mine if a.outcome is not None),
                "rate_limited": sum(1 for a in mine if a.outcome == "rate_limited"),
                "tokens": sum(a.input_tokens + a.output_tokens for a in mine),
                "cost_usd": rounded(sum(a.cost for a in mine), 6),
                "latency_p50": latency["p50"],
                "latency_p99": latency["p99"],
                "cooldowns": count,
                "cooled_seconds": rounded(seconds, 3),
                "limits": _limits_now(last, next((row for row in noted if not row[4]), None)),
            }
        )
    return rows


def _limits_now(last: tuple[Any, ...] | None, configured: tuple[Any, ...] | None) -> dict[str, Any] | None:
    """The limits last noted, and those configured (none: the deployment had none of its own)."""
    if last is None:
        return None
    first = configured or (None, None, None, None, False)
    return {
        "rpm": last[1],
        "tpm": last[2],
        "max_in_flight": last[3],
        "learnt": bool(last[4]),
        "configured": {"rpm": first[1], "tpm": first[2], "max_in_flight": first[3]},
    }


def _cost_by(timeline: _Timeline, attempts: Sequence[_Attempt]) -> dict[str, dict[str, float]]:
    """Dollars by model, deployment and tier (every attempt's charge, failures included)."""
    out: dict[str, dict[str, float]] = {"model": {}, "deployment": {}, "tier": {}}
    for a in attempts:
        info = timeline.deployments.get(a.deployment, {})
        for name, key in (
            ("deployment", a.deployment),
            ("model", str(info.get("model") or a.deployment)),
            ("tier", str(info.get("tier") or "sync")),
        ):
            out[name][key] = out[name].get(key, 0.0) + a.cost
    return {
        name: {k: rounded(v, 6) for k, v in sorted(sums.items(), key=lambda kv: -kv[1])} for name, sums in out.items()
    }


def _as_they_ended(
    cooldowns: list[tuple[str, float, float, str]], attempts: Sequence[_Attempt], end: float
) -> list[tuple[str, float, float, str]]:
    """Cooldowns as they were, not as they were planned: one ends early when the
    deployment took an attempt again (its probe answered, a learnt pause was shorter),
    and none outlasts the job."""
    starts: dict[str, list[float]] = defaultdict(list)
    for a in attempts:
        starts[a.deployment].append(a.started)
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
