"""``sluice report STATE``: a past or running job, from its state file alone."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

from .._stats import LatencyHistogram
from ..store import SqliteStore

__all__ = ["report_rows"]


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


def report_rows(path: Path) -> list[tuple[str, str]]:
    store = SqliteStore(path, readonly=True)
    try:
        meta = store.meta()
        summary = store.summary()
        histogram = LatencyHistogram()
        for latency in store.latencies():
            histogram.add(latency)
    finally:
        store.close()
    status = str(meta.get("status", "unknown"))
    if status == "running" and not _alive(meta.get("pid")):
        status = "interrupted (its process is gone; rerun the command to resume)"
    elif status == "running":
        status = f"running (pid {meta.get('pid')})"
    rows = [
        ("status", status),
        ("input", str(meta.get("input", "-"))),
        ("output", str(meta.get("output", "-"))),
        ("started", _when(meta.get("started_at"))),
        ("last result", _when(summary["last_finished_at"])),
        ("records in input", f"{meta.get('total', 0):,}"),
        ("records written", f"{meta.get('written', 0):,}" if "written" in meta else "-"),
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
    rows += _deployment_rows(meta)
    p50, p90, p99 = (histogram.percentile(q) for q in (50, 90, 99))
    if p50 is not None and p90 is not None and p99 is not None:
        rows.append(("latency", f"p50 {p50:.3f}s, p90 {p90:.3f}s, p99 {p99:.3f}s"))
    return rows


def _deployment_rows(meta: dict[str, object]) -> list[tuple[str, str]]:
    """Each deployment's last noted state: answered, failed, cooling down (as of when)."""
    noted = meta.get("deployments")
    if not isinstance(noted, list) or not noted:
        return []
    at = meta.get("deployments_at")
    rows = [("deployments", f"as of {_when(at)}")]
    for entry in noted:
        if not isinstance(entry, dict):
            continue
        state = str(entry.get("state", "?"))
        if state == "cooling down":
            state = f"cooling down, {float(entry.get('seconds_left') or 0):.0f} s left"
        text = f"{state}; {entry.get('answered', 0):,} answered, {entry.get('failed', 0):,} failed attempts"
        if entry.get("last_error") and entry.get("failed"):
            text += f" (last: {entry['last_error']})"
        rows.append((f"  {entry.get('deployment')}", text))
    return rows
