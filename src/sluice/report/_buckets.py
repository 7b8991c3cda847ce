"""Time buckets: what keeps a report's size bounded, whatever the job's length.

Every series of the report has one value per bucket, and there are at most
:data:`MAX_BUCKETS` of them (a round width: 1 s, 15 s, 10 min...), so a million-line job
plots as many points as a thousand-line one. Written by hand: the arithmetic is a few
lines, and pulling in numpy or pandas for it would cost every ``sluice`` install tens of
megabytes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from .._stats import LatencyHistogram

__all__ = ["MAX_BUCKETS", "Buckets", "histogram", "rounded"]

#: The most buckets a series has (and so the most points a chart draws per line).
MAX_BUCKETS = 240
#: The fewest a short job gets (its buckets shrink below a second to keep that many).
_MIN_BUCKETS = 40
_STEPS = (0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)


def rounded(value: float, digits: int = 4) -> float:
    """``value`` to ``digits`` significant digits: plotted figures need no more, and the
    report's size is mostly its numbers."""
    if value == 0 or not math.isfinite(value):
        return 0.0 if not math.isfinite(value) else value
    return round(value, digits - 1 - math.floor(math.log10(abs(value))))


class Buckets:
    """Equal, round-width buckets over [start, end]."""

    __slots__ = ("count", "start", "width")

    def __init__(self, start: float, end: float) -> None:
        span = max(end - start, 0.0)
        wanted = max(span / MAX_BUCKETS, min(1.0, span / _MIN_BUCKETS))
        self.width = float(next((step for step in _STEPS if step >= wanted), math.ceil(wanted / 86400) * 86400))
        self.start = math.floor(start / self.width) * self.width
        self.count = max(1, math.ceil((end - self.start) / self.width + 1e-9))

    def index(self, t: float) -> int:
        """The bucket of time ``t`` (clamped into range)."""
        return min(self.count - 1, max(0, int((t - self.start) / self.width)))

    @property
    def times(self) -> list[float]:
        """Each bucket's start: the x axis."""
        return [round(self.start + i * self.width, 3) for i in range(self.count)]

    def zeros(self) -> list[float]:
        return [0.0] * self.count

    def in_flight(self, spans: Iterable[tuple[float, float]]) -> tuple[list[float], list[int]]:
        """Attempts at the provider in each bucket: on average (time-weighted) and at the peak."""
        average = self.zeros()
        starts: list[float] = []
        ends: list[float] = []
        width = self.width
        for begun, ended in spans:
            starts.append(begun)
            ends.append(ended)
            first, last = self.index(begun), self.index(ended)
            for i in range(first, last + 1):
                low = max(begun, self.start + i * width)
                high = min(ended, self.start + (i + 1) * width)
                if high > low:
                    average[i] += (high - low) / width
        return [rounded(v, 3) for v in average], self._peaks(sorted(starts), sorted(ends))

    def _peaks(self, starts: list[float], ends: list[float]) -> list[int]:
        """The most attempts at once in each bucket: a sweep over the sorted starts and ends
        (an end at the moment of a start goes first); a bucket with no start or end in it
        has what was in flight across it."""
        peaks = [0] * self.count
        current = 0
        i = j = 0
        filled = -1  # buckets up to here have their level from before their first event
        while i < len(starts) or j < len(ends):
            ending = j < len(ends) and (i >= len(starts) or ends[j] <= starts[i])
            t = ends[j] if ending else starts[i]
            b = self.index(t)
            for k in range(filled + 1, b + 1):
                peaks[k] = max(peaks[k], current)
            filled = max(filled, b)
            if ending:
                current -= 1
                j += 1
            else:
                current += 1
                i += 1
                peaks[b] = max(peaks[b], current)
        return peaks

    def percentiles(self, values: Iterable[tuple[float, float]], qs: Sequence[float]) -> list[list[float | None]]:
        """Per bucket (by the time given with each value), the ``qs`` percentiles of the
        values; one series per percentile, None where a bucket has no value."""
        hists: dict[int, LatencyHistogram] = {}
        for t, value in values:
            i = self.index(t)
            hist = hists.get(i)
            if hist is None:
                hist = hists[i] = LatencyHistogram()
            hist.add(value)
        series: list[list[float | None]] = [[None] * self.count for _ in qs]
        for i, hist in hists.items():
            for row, q in zip(series, qs, strict=True):
                found = hist.percentile(q)
                row[i] = rounded(found) if found is not None else None
        return series


def histogram(values: Sequence[float], bins: int = 30) -> dict[str, list[float]]:
    """Counts of ``values`` in ``bins`` log-spaced bins (latencies span orders of
    magnitude): ``edges`` (bins + 1 of them) and ``counts``."""
    positive = [v for v in values if v > 0]
    if not positive:
        return {"edges": [], "counts": []}
    low, high = min(positive), max(positive)
    if high <= low * 1.0001:
        return {"edges": [rounded(low * 0.95), rounded(high * 1.05)], "counts": [float(len(positive))]}
    ratio = math.log(high / low) / bins
    edges = [low * math.exp(ratio * i) for i in range(bins + 1)]
    counts = [0.0] * bins
    for value in positive:
        counts[min(bins - 1, int(math.log(value / low) / ratio))] += 1
    return {"edges": [rounded(e) for e in edges], "counts": counts}
