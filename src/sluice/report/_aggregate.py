"""A job's report as plain data: what ``sluice report --json`` prints and the HTML plots.

Made from the state file alone (and the output, for the lines it names): its timeline
when it has one (every attempt, cooldown and limit, see :mod:`sluice.store._timeline`),
else its results, one per request, which tell less (no retried 429, no cooldown, the
last attempt's latency only; ``source`` says which). Everything over time is in
:class:`~._buckets.Buckets` (:mod:`._series`), so the report's size does not grow with
the job.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ..batch._report import job_status
from ..caching._report import fold_summaries
from ..store import SqliteStore
from ._buckets import rounded
from ._lines import from_output, from_state
from ._series import Columns, Timeline, over_time

__all__ = ["FORMAT", "build_report"]

#: The version of the report's JSON layout (``sluice report --json``).
FORMAT = 1


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
    report.update(over_time(timeline, float(summary["cost_usd"] or 0.0)))
    budget = report.pop("budget_usd", None)
    if report["job"]["budget_usd"] is None:
        report["job"]["budget_usd"] = budget  # the last run's (the state's notes have none)
    report["lines"] = lines
    # what the prompt-cache planner did over every run (None: it planned nothing)
    report["prompt_cache"] = fold_summaries(meta.get("prompt_cache_earlier"), meta.get("prompt_cache"))
    finite: dict[str, Any] = _finite(report)
    return finite


def _finite(value: Any) -> Any:
    """The report with every non-finite number (a ``--budget inf``'s) as None: JSON has none."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


# -- reading -----------------------------------------------------------------------------


def _read_timeline(store: SqliteStore) -> Timeline:
    if not store.has_timeline():
        return _from_results(store)
    timeline = Timeline("timeline")
    labels: dict[int, str] = {}
    for row_id, label, model, tier, provider in store.report_rows("deployments"):
        labels[row_id] = label
        timeline.deployments[label] = {"model": model, "tier": tier, "provider": provider}
    rows = list(store.report_rows("attempts"))
    if rows:
        columns = map(list, zip(*rows, strict=True))
        started, seconds, deployment, number, outcome, _, tokens_in, tokens_out, cost, ttft = columns
        names = [labels.get(d, "?") for d in deployment]
        retries = [int(n > 1) for n in number]
        timeline.attempts = Columns(started, seconds, names, retries, outcome, tokens_in, tokens_out, cost, ttft)
    for dep, started_at, ended_at, why in store.report_rows("cooldowns"):
        timeline.cooldowns.append((labels.get(dep, "?"), started_at, ended_at, why))
    for at, dep, rpm, tpm, in_flight, learnt in store.report_rows("limits"):
        timeline.limits.setdefault(labels.get(dep, "?"), []).append((at, rpm, tpm, in_flight, bool(learnt)))
    for started_at, pid, concurrency, budget in store.report_rows("runs"):
        timeline.runs.append({"start": started_at, "pid": pid, "concurrency": concurrency, "budget_usd": budget})
    if not rows:  # a job whose workers kept none (--redis): its results, if it has any
        from_results = _from_results(store)
        if from_results.attempts.started:
            return from_results
    return timeline


def _from_results(store: SqliteStore) -> Timeline:
    """A state from before the timeline: each result as its last attempt (its earlier
    attempts are counted as retries at its start, their outcomes unknown)."""
    timeline = Timeline("results")
    cols = timeline.attempts
    for started, seconds, label, model, tier, attempts, ok, kind, _, tokens_in, tokens_out, cost in store.report_rows(
        "results"
    ):
        label = str(label or model or "?")
        timeline.deployments.setdefault(label, {"model": model, "tier": tier, "provider": None})
        cols.started.append(float(started))
        cols.seconds.append(float(seconds))
        cols.deployment.append(label)
        cols.retries.append(max(0, int(attempts or 1) - 1))
        cols.outcome.append(None if ok else str(kind or "error"))
        cols.input_tokens.append(int(tokens_in))
        cols.output_tokens.append(int(tokens_out))
        cols.cost.append(float(cost))
        cols.ttft.append(None)
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
