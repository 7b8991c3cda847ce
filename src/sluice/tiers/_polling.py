"""When to look at a running provider batch again (:class:`Polls`).

A batch says how far it has got (its request counts). Looked at every ``--poll-every``
seconds, a batch that ends just after a look is collected up to that long late (30 s by
default; and its lines are written only then). So the wait follows the batch: from two
looks that saw it move, the time it needs to finish at that pace; the next look comes
then (a second at least), never later than ``--poll-every``. A batch not seen moving
(queued, validating: hours, at a busy provider) is looked at after 1, 2, 4, ... seconds,
up to ``--poll-every``: one that starts at once is seen at once, one that waits costs a
few looks more than before.
"""

from __future__ import annotations

__all__ = ["Polls"]

#: The shortest wait between two looks at one batch, seconds (``--poll-every`` if shorter).
_SOONEST = 1.0


class Polls:
    """One batch's looks: how long to wait before the next."""

    __slots__ = ("_every", "_quiet", "_seen")

    def __init__(self, every: float) -> None:
        self._every = every
        self._quiet = min(every, _SOONEST)  # the next wait while it is not seen moving (doubling)
        self._seen: tuple[float, int] | None = None  # when it was first seen with lines done, and how many

    def wait(self, now: float, progress: tuple[int, int] | None) -> float:
        """Seconds until the next look, the batch having ``progress`` (lines done, of how
        many; None: it does not say) at ``now``."""
        soonest = min(self._every, _SOONEST)
        if progress is not None and progress[1] > 0 and progress[0] >= progress[1]:
            return soonest  # every line done: it is being finalized
        if progress is not None and progress[0] > 0:
            done, total = progress
            if self._seen is None or done < self._seen[1]:
                self._seen = (now, done)
            then, before = self._seen
            if done > before and now > then:  # it moves: the next look when it should be done
                left = (total - done) / ((done - before) / (now - then))
                return max(soonest, min(self._every, left))
        wait = self._quiet
        self._quiet = min(self._every, 2 * wait)
        return wait
