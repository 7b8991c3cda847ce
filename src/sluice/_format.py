"""Figures as a person reads them (durations, dollars), for summaries, estimates and reports."""

from __future__ import annotations

import math

__all__ = ["format_duration", "usd"]


def format_duration(seconds: float | None) -> str:
    """``0:42``, ``1:02:03``; ``?`` when unknown or endless."""
    if seconds is None or seconds != seconds or seconds == float("inf"):
        return "?"
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def usd(amount: float) -> str:
    """Dollars with the precision that matters: cents for large sums, 1/100 cent for small
    ones, and two significant digits below that, so a real cost never shows as $0.0000."""
    size = abs(amount)
    if size >= 10 or size == 0:
        return f"${amount:,.2f}"
    if size >= 0.01:
        return f"${amount:,.4f}"
    decimals = min(12, 1 - math.floor(math.log10(size)))
    return f"${amount:,.{decimals}f}"
