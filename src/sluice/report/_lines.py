"""The lines a report names: the slowest, and the failed ones with their errors.

Read from the job's output when it is there (it has each record's line number and
custom id, which the state does not keep), else from the state's results (named by
their key). One pass over the file, a bounded heap: memory stays flat over a
million-line output.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .. import _json
from ..store import SqliteStore

__all__ = ["from_output", "from_state"]

#: The longest text (an error message, a custom id) a report shows of one line.
_MAX_TEXT = 300


def _clip(value: object) -> str | None:
    if value is None:
        return None
    text = str(value)
    return text if len(text) <= _MAX_TEXT else text[: _MAX_TEXT - 1] + "…"


def _line_row(record: Mapping[str, Any]) -> dict[str, Any]:
    error = record.get("error") if isinstance(record.get("error"), Mapping) else {}
    latency = record.get("latency_s")
    return {
        "line": record.get("line") if isinstance(record.get("line"), int) else None,
        "id": _clip(record.get("custom_id") or record.get("id")),
        "ok": bool(record.get("ok")),
        "latency_s": float(latency) if isinstance(latency, (int, float)) else None,
        "attempts": record.get("attempts") if isinstance(record.get("attempts"), int) else None,
        "deployment": _clip(record.get("deployment")),
        "error": _clip(error.get("type")) if error else None,
        "status": error.get("status") if error and isinstance(error.get("status"), int) else None,
        "message": _clip(error.get("message")) if error else None,
    }


def from_output(path: Path, top: int) -> dict[str, Any] | None:
    """The ``top`` slowest records and the first ``top`` failed ones of an output file,
    with the counts of its records; None when it cannot be read."""
    slowest: list[tuple[float, int, dict[str, Any]]] = []
    failed: list[dict[str, Any]] = []
    counts = {"records": 0, "succeeded": 0, "failed": 0, "unreadable": 0}
    errors: dict[str, int] = {}
    try:
        with path.open("rb") as f:
            for number, raw in enumerate(f):
                try:
                    record = _json.loads(raw)
                except ValueError:  # a line being written by a running job, or damaged
                    counts["unreadable"] += 1
                    continue
                if not isinstance(record, dict):
                    counts["unreadable"] += 1
                    continue
                counts["records"] += 1
                ok = bool(record.get("ok"))
                counts["succeeded" if ok else "failed"] += 1
                if not ok:
                    error = record.get("error")
                    kind = str(error.get("type")) if isinstance(error, dict) else "error"
                    errors[kind] = errors.get(kind, 0) + 1
                    if len(failed) < top:
                        failed.append(_line_row(record))
                latency = record.get("latency_s")
                if isinstance(latency, (int, float)) and not record.get("cached"):
                    entry = (float(latency), -number, record)
                    if len(slowest) < top:
                        heapq.heappush(slowest, entry)
                    elif entry[:2] > slowest[0][:2]:
                        heapq.heapreplace(slowest, entry)
    except OSError:
        return None
    ranked = [_line_row(record) for *_, record in sorted(slowest, key=lambda e: e[:2], reverse=True)]
    return {
        "from": "output",
        "slowest": ranked,
        "failed": failed,
        "failed_total": counts["failed"],
        "errors": dict(sorted(errors.items(), key=lambda kv: -kv[1])),
        "counted": counts,
    }


def from_state(store: SqliteStore, top: int, failed_total: int) -> dict[str, Any]:
    """The same from the state's results, when the output is not there (named by key)."""

    def rows(found: Iterable[tuple[Any, ...]]) -> list[dict[str, Any]]:
        out = []
        for key, latency, attempts, deployment, _model, _tier, ok, kind, message in found:
            record = {
                "id": f"key {str(key)[:16]}",
                "ok": ok,
                "latency_s": latency,
                "attempts": attempts,
                "deployment": deployment,
                "error": {"type": kind, "message": message} if kind else None,
            }
            out.append(_line_row(record))
        return out

    return {
        "from": "state",
        "slowest": rows(store.report_rows("slowest", top)),
        "failed": rows(store.report_rows("failed", top)),
        "failed_total": failed_total,
    }
