"""What a job's lines would read from and write to the prompt caches, before anything is
sent (``sluice estimate``): the plan's own rules on sluice's token estimates (on the batch
tier, hour-long writes where they pay, as the plan asks for them).

The index holds the whole input's counts (a first pass); lines are then taken in turn:
the first line of each group writes its shared prefix, the others read it (the plan sends
one first and the rest once it has answered). Lifetimes, OpenAI's key shards and what a
provider's tokenizer makes of the text are not foreseen: an estimate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ._fingerprint import fingerprint
from ._index import PrefixIndex
from ._plan import cache_rates, shared_chain
from ._rules import LOWEST_MINIMUM, MAX_BREAKPOINTS, rules_for

if TYPE_CHECKING:
    from .._models import Deployment, Request
    from .._pricing import Pricing

__all__ = ["Forecast", "Foreseen"]

#: OpenAI's hits come in 128-token steps.
_OPENAI_STEP = 128


@dataclass(frozen=True, slots=True)
class Foreseen:
    """One line's prompt as the plan foresees it: tokens read, written (and billed as
    writes: Anthropic's, and OpenAI's on the models that bill them), and the group it is in."""

    read: int = 0
    written: int = 0
    group: int | None = None
    #: Written for an hour (the batch tier's lines, where that pays: twice the input price).
    hour: bool = False


class Forecast:
    """The lines of one job in turn (see the module docstring)."""

    __slots__ = ("_pricing", "_rates", "_written", "index")

    def __init__(self, index: PrefixIndex, pricing: Pricing) -> None:
        self.index = index
        self._pricing = pricing
        self._written: set[int] = set()
        self._rates: dict[int, object] = {}

    @property
    def groups(self) -> int:
        return len(self._written)

    def line(self, request: Request, deployment: Deployment, prompt: int) -> Foreseen:
        """What ``request`` (of about ``prompt`` tokens) would read and write on ``deployment``."""
        rules = rules_for(deployment)
        if rules is None or prompt < LOWEST_MINIMUM or request.native is not None:
            return Foreseen()
        rates = cache_rates(self._pricing, deployment, rules)
        room = MAX_BREAKPOINTS if rules.breakpoints else 1
        chain = shared_chain(fingerprint(request), self.index, rules, rates, room)
        if not chain:
            return Foreseen()
        read = 0
        for boundary, _ in chain:
            if boundary.digest in self._written:
                read = boundary.tokens
        deepest = chain[-1][0]
        for boundary, _ in chain:
            self._written.add(boundary.digest)
        written = max(0, deepest.tokens - read)
        if rules.kind == "openai":
            read = read // _OPENAI_STEP * _OPENAI_STEP
            written = written if rates.write > 1.0 else 0  # writes billed as plain input
        # as the plan asks (PromptCache.chain): the batch tier writes for an hour where that pays
        hour = rules.kind == "anthropic" and deployment.tier == "batch" and rates.pays(chain[-1][1], hour=True)
        read = min(read, prompt)
        return Foreseen(read, min(written, prompt - read), deepest.digest, hour and written > 0)
