"""Time buckets: what keeps a report's size bounded, whatever the job's length.

Every series of the report has one value per bucket, and there are at most
:data:`MAX_BUCKETS` of them (a round width: 1 s, 15 s, 10 min...), so a million-line job
plots as many points as a thousand-line one. The attempts come as columns (lists), and
each pass over them is one loop with no call per attempt it can avoid: a million
attempts are a few seconds of work. Written by hand: the arithmetic is a few lines, and
numpy or pandas for it would cost every ``sluice`` install tens of megabytes.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

__all__ = ["MAX_BUCKETS", "Buckets", "histogram", "percentile", "rounded"]

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


def percentile(ordered: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (nearest rank) of values sorted ascending; None of none."""
    if not ordered:
        return None
    return ordered[max(1, math.ceil(len(ordered) * q / 100.0)) - 1]


class Buckets:
    """Equal, round-width buckets over [start, end]."""

    __slots__ = ("count", "start", "width")

    def __init__(self, start: float, end: float) -> None:
        span = max(end - start, 0.0)
        wanted = max(span / MAX_BUCKETS, min(1.0, span / _MIN_BUCKETS))
        self.width = float(next((step for step in _STEPS if step >= wanted), math.ceil(wanted / 86400) * 86400))
        self.start = math.floor(start / self.width) * self.width
        self.count = max(1, math.ceil((end - self.start) / self.width + 1e-9))

    def indices(self, times: Sequence[float]) -> list[int]:
        """The bucket of each of ``times`` (clamped into range)."""
        start, inverse, top = self.start, 1.0 / self.width, self.count - 1
        return [(i if i <= top else top) if (i := int((t - start) * inverse)) >= 0 else 0 for t in times]

    @property
    def times(self) -> list[float]:
        """Each bucket's start: the x axis."""
        return [round(self.start + i * self.width, 3) for i in range(self.count)]

    def zeros(self) -> list[float]:
        return [0.0] * self.count

    def in_flight(
        self, started: Sequence[float], ended: Sequence[float], first: Sequence[int], last: Sequence[int]
    ) -> tuple[list[float], list[int]]:
        """Attempts at the provider in each bucket: on average (time-weighted) and at the
        peak; ``first`` and ``last`` are the buckets each attempt began and ended in."""
        average = self.zeros()
        width, origin = self.width, self.start
        inverse = 1.0 / width
        for begun, done, i, j in zip(started, ended, first, last, strict=True):
            if i == j:  # the common case: over within its bucket
                average[i] += (done - begun) * inverse
                continue
            average[i] += (origin + (i + 1) * width - begun) * inverse
            for k in range(i + 1, j):
                average[k] += 1.0
            average[j] += (done - (origin + j * width)) * inverse
        return [rounded(v, 3) for v in average], self._peaks(sorted(started), sorted(ended))

    def _peaks(self, starts: list[float], ends: list[float]) -> list[int]:
        """The most attempts at once in each bucket: a sweep over the sorted starts and ends
        (an end at the moment of a start goes first); a bucket with no start or end in it
        has what was in flight across it."""
        peaks = [0] * self.count
        start_at, end_at = self.indices(starts), self.indices(ends)
        current = 0
        i = j = 0
        filled = -1  # buckets up to here have their level from before their first event
        n, m = len(starts), len(ends)
        while i < n or j < m:
            ending = j < m and (i >= n or ends[j] <= starts[i])
            b = end_at[j] if ending else start_at[i]
            if b > filled:
                for k in range(filled + 1, b + 1):
                    if peaks[k] < current:
                        peaks[k] = current
                filled = b
            if ending:
                current -= 1
                j += 1
            else:
                current += 1
                i += 1
                if peaks[b] < current:
                    peaks[b] = current
        return peaks

    def percentiles(self, groups: list[list[float]], qs: Sequence[float]) -> list[list[float | None]]:
        """Per bucket, the ``qs`` percentiles of its values (``groups``: a list per bucket);
        one series per percentile, None where a bucket has none."""
        series: list[list[float | None]] = [[None] * self.count for _ in qs]
        for i, values in enumerate(groups):
            if values:
                values.sort()
                for row, q in zip(series, qs, strict=True):
                    found = percentile(values, q)
                    row[i] = rounded(found) if found is not None else None
        return series


def histogram(ordered: Sequence[float], bins: int = 30) -> dict[str, list[float]]:
    """Counts of values (sorted ascending) in ``bins`` log-spaced bins (latencies span
    orders of magnitude): ``edges`` (bins + 1 of them) and ``counts``."""
    first = bisect.bisect_right(ordered, 0.0)
    if first >= len(ordered):
        return {"edges": [], "counts": []}
    low, high = ordered[first], ordered[-1]
    if high <= low * 1.0001:
        return {"edges": [rounded(low * 0.95), rounded(high * 1.05)], "counts": [float(len(ordered) - first)]}
    ratio = math.log(high / low) / bins
    edges = [low * math.exp(ratio * i) for i in range(bins + 1)]
    cuts = [first, *(bisect.bisect_left(ordered, edge) for edge in edges[1:-1]), len(ordered)]
    counts = [float(cuts[i + 1] - cuts[i]) for i in range(bins)]
    return {"edges": [rounded(e) for e in edges], "counts": counts}
