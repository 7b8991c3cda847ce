"""``sluice report STATE``: a past or running job, from its state file alone."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import Any

from .._format import usd
from .._stats import LatencyHistogram
from ..store import SqliteStore

__all__ = ["job_status", "report_rows", "structured_line"]


def _when(timestamp: object) -> str:
    if not isinstance(timestamp, (int, float)):
        return "-"
    return dt.datetime.fromtimestamp(timestamp, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _alive(pid: object) -> bool:
    if not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def job_status(meta: dict[str, object]) -> str:
    """finished, interrupted, or running (a job whose process is gone was interrupted)."""
    status = str(meta.get("status", "unknown"))
    if status == "running" and not _alive(meta.get("pid")):
        return "interrupted (its process is gone; rerun the command to resume)"
    if status == "running":
        return f"running (pid {meta.get('pid')})"
    return status


def report_rows(path: Path) -> list[tuple[str, str]]:
    store = SqliteStore(path, readonly=True)
    try:
        meta = store.meta()
        summary = store.summary()
        structured = store.structured_summary()
        histogram = LatencyHistogram()
        for latency in store.latencies():
            histogram.add(latency)
        batched = store.batch_answers()
        chunks = store.chunk_counts()
    finally:
        store.close()
    rows = [
        *_job_rows(meta, summary),
        ("answers stored", f"{summary['results']:,}"),
        ("  succeeded", f"{summary['succeeded']:,}"),
        ("  failed", f"{summary['failed']:,}"),
    ]
    for kind, count in summary["errors"].items():
        rows.append((f"    {kind}", f"{count:,}"))
    if summary.get("embeddings"):
        failed = summary["embeddings"] - summary["embeddings_ok"]
        rows.append(("texts embedded", f"{summary['embeddings_ok']:,} stored ({failed:,} rejected)"))
    rows += [
        ("attempts", f"{summary['attempts']:,}"),
        ("tokens", f"{summary['input_tokens']:,} in, {summary['output_tokens']:,} out"),
    ]
    if summary["cost_usd"] is not None:
        rows.append(("cost", f"${summary['cost_usd']:,.4f}"))
    if structured is not None:
        rows.append(("structured", structured_line(**structured)))
    rows += _deployment_rows(meta)
    rows += _batch_rows(chunks)
    p50, p90, p99 = (histogram.percentile(q) for q in (50, 90, 99))
    if p50 is not None and p90 is not None and p99 is not None:
        timed = " (synchronous answers)" if batched else ""
        rows.append(("latency", f"p50 {p50:.3f}s, p90 {p90:.3f}s, p99 {p99:.3f}s{timed}"))
    elif batched:
        rows.append(("latency", "n/a: batch answers are not timed one by one"))
    return rows


def _job_rows(meta: dict[str, Any], summary: dict[str, Any]) -> list[tuple[str, str]]:
    """The job the state is of: its status, files and records; for a state a program made
    with the library (no ``sluice run`` wrote its notes), what is known: when its answers
    were stored."""
    if not any(key in meta for key in ("status", "input", "total")):
        return [
            ("made by", "a program using the library (not a sluice run job: it has no input, output or status)"),
            ("first result", _when(summary["first_finished_at"])),
            ("last result", _when(summary["last_finished_at"])),
        ]
    status = job_status(meta)
    return [
        ("status", status),
        ("input", str(meta.get("input", "-"))),
        ("output", str(meta.get("output", "-"))),
        ("started", _when(meta.get("started_at"))),
        ("last result", _when(summary["last_finished_at"])),
        ("records in input", f"{meta.get('total', 0):,}"),
        ("records written", _written(meta, status)),
    ]


def structured_line(*, valid: int, reasked: int, invalid: int, reasks: int, reask_cost_usd: float, **_: Any) -> str:
    """Answers with a schema, in words: how many parsed, how many needed re-asks, what those cost."""
    text = f"{valid:,} valid ({reasked:,} after re-asks), {invalid:,} invalid_output"
    if reasks:
        text += f"; {reasks:,} re-asks cost {usd(reask_cost_usd)}"
    return text


def _written(meta: dict[str, object], status: str) -> str:
    written = meta.get("written")
    if not isinstance(written, int):
        return "-"
    if status.startswith("running") and meta.get("deployments_at"):
        return f"{written:,} (as of {_when(meta.get('deployments_at'))})"
    return f"{written:,}"


def _deployment_rows(meta: dict[str, object]) -> list[tuple[str, str]]:
    """Each deployment's answers and failed attempts over every run, and its state when
    the last run noted it (cooling down, and why)."""
    noted = meta.get("deployments")
    last = [entry for entry in noted if isinstance(entry, dict)] if isinstance(noted, list) else []
    earlier = meta.get("deployments_earlier")
    totals: dict[str, dict[str, int]] = earlier if isinstance(earlier, dict) else {}
    labels = list(dict.fromkeys([*totals, *(str(entry.get("deployment")) for entry in last)]))
    if not labels:
        return []
    runs = meta.get("runs")
    across = f"all {runs} runs" if isinstance(runs, int) and runs > 1 else "this job's run"
    rows = [
        ("deployments", f"answers over {across}; state as the last run left it ({_when(meta.get('deployments_at'))})")
    ]
    by_label = {str(entry.get("deployment")): entry for entry in last}
    for label in labels:
        entry = by_label.get(label, {})
        before = totals.get(label, {})
        answered = int(before.get("answered") or 0) + int(entry.get("answered") or 0)
        failed = int(before.get("failed") or 0) + int(entry.get("failed") or 0)
        state = str(entry.get("state", "not used in the last run"))
        if state == "cooling down":
            state = f"cooling down, {float(entry.get('seconds_left') or 0):.0f} s left"
        text = f"{state}; {answered:,} answered, {failed:,} failed attempts"
        if before and entry:
            text += f" ({int(entry.get('answered') or 0):,} answered in the last run)"
        if entry.get("last_error") and entry.get("failed"):
            text += f" (last error: {entry['last_error']})"
        rows.append((f"  {label}", text))
    return rows


#: How the journal names a provider batch's progress (``store._batches``), for people.
_CHUNK_STATES = {
    "submitting": "being submitted (or a crash left it unrecorded: the rerun looks it up)",
    "submitted": "at the provider (a rerun collects them)",
    "collected": "collected",
    "abandoned": "never created (their lines were sent again)",
}


def _batch_rows(chunks: list[tuple[str, str, int, int]]) -> list[tuple[str, str]]:
    """The job's provider batches (``--tier batch``/``auto``) by deployment and state."""
    rows = []
    for deployment, status, batches, lines in chunks:
        state = _CHUNK_STATES.get(status, status)
        rows.append((f"batches {deployment}", f"{batches:,} {state}: {lines:,} lines"))
    return rows
