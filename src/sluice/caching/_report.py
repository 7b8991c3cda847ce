"""What the planner did, for people: the summary's and ``sluice report``'s rows, and the
figures of several runs of one job folded into one (``PromptCache.summary`` is one run's)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["fold_summaries", "summary_rows"]

_COUNTS = ("requests", "hits", "uncached_tokens", "written_tokens", "read_tokens", "duplicate_writes", "saved_usd")


def _hit_rate(figures: Mapping[str, Any]) -> float:
    total = sum(float(figures.get(k) or 0) for k in ("uncached_tokens", "written_tokens", "read_tokens"))
    return float(figures.get("read_tokens") or 0) / total if total else 0.0


def _added(one: Mapping[str, Any], other: Mapping[str, Any]) -> dict[str, Any]:
    added: dict[str, Any] = {k: (one.get(k) or 0) + (other.get(k) or 0) for k in _COUNTS}
    if "tokens" in one or "tokens" in other:
        added["tokens"] = one.get("tokens") or other.get("tokens") or 0
    added["hit_rate"] = round(_hit_rate(added), 4)
    return added


def fold_summaries(earlier: object, last: object) -> dict[str, Any] | None:
    """One job's planner figures over its runs: ``earlier`` (folded before) and ``last``
    (the last run's ``PromptCache.summary``); None when neither has any."""
    parts = [part for part in (earlier, last) if isinstance(part, Mapping) and part.get("requests")]
    if not parts:
        return None
    folded: dict[str, Any] = {"by_deployment": {}, "by_group": {}}
    for part in parts:
        folded.update(_added(folded, part))
        folded["groups"] = max(int(folded.get("groups") or 0), int(part.get("groups") or 0))
        for key in ("by_deployment", "by_group"):
            into = folded[key]
            for label, figures in (part.get(key) or {}).items():
                if isinstance(figures, Mapping):
                    into[label] = _added(into.get(label, {}), figures)
    return folded


def summary_rows(summary: Mapping[str, Any] | None, *, groups: int = 5) -> list[tuple[str, str]]:
    """Rows of a table: tokens sent uncached, written and read, the hit rate per deployment
    and for the largest groups, duplicate writes and dollars saved against sending the
    same lines uncached. Nothing when nothing was planned."""
    if not summary or not summary.get("requests"):
        return []
    rows = [
        (
            "prompt cache",
            f"{summary['read_tokens']:,} tokens read, {summary['written_tokens']:,} written, "
            f"{summary['uncached_tokens']:,} uncached ({_hit_rate(summary):.0%} read) over "
            f"{summary['requests']:,} requests in {summary.get('groups', 0):,} groups",
        ),
        (
            "  saved",
            f"${float(summary['saved_usd']):,.4f} against the same requests uncached; "
            f"{summary['duplicate_writes']:,} duplicate writes",
        ),
    ]
    for label, figures in sorted((summary.get("by_deployment") or {}).items()):
        rows.append((f"  {label}", f"{_hit_rate(figures):.0%} read, {figures['requests']:,} requests"))
    largest = sorted((summary.get("by_group") or {}).items(), key=lambda kv: -int(kv[1].get("requests") or 0))
    for label, figures in largest[:groups]:
        rows.append(
            (
                f"  group {label}",
                f"{figures.get('tokens', 0):,} shared tokens, {figures['requests']:,} requests, "
                f"{_hit_rate(figures):.0%} read",
            )
        )
    return rows
