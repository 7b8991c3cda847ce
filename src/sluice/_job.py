"""One logical request as the engine runs it: what is asked, where it may go, what it may cost.

A :class:`Job` lives from admission to its Result. Its attempts may go to several
deployments (a group) and to the models of its fallbacks; ``step`` says which of
``groups`` it is on, ``tried`` which deployments failed it. Values only: the attempt
loop (:mod:`._attempts`) is what changes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ._models import idempotency_key_of

if TYPE_CHECKING:
    from ._budget import Budget
    from ._models import Request, Result
    from ._router import Group, Route
    from ._tracing import RequestTrace
    from .caching import Planned

__all__ = ["Job", "idempotency_key_of"]


@dataclass(slots=True)
class Job:
    request: Request
    #: Where the latest attempt went (before the first: the first deployment it may use).
    route: Route
    #: What an attempt reserves: the prompt estimate plus the output cap.
    tokens: int
    priority: int
    seq: int
    submitted: float
    index: int | None = None
    key: str | None = None
    budget: Budget | None = None
    worst_cost: float = 0.0
    #: What was reported when the job's task was cancelled (``map`` hands it out).
    cancelled: Result | None = None
    #: The groups of deployments it may use: its model's, then its fallbacks'.
    groups: tuple[Group, ...] = ()
    #: Which of ``groups`` it is on now.
    step: int = 0
    #: Deployments that failed this request (a retry goes elsewhere when it can); a shared
    #: empty frozenset until the first one (no set per request on the hot path).
    tried: set[Route] | frozenset[Route] = frozenset()
    #: Cooldowns apply: the request has somewhere else to go.
    guarded: bool = False
    #: ``worst_cost`` is an attempt's worst case with or without a budget (an embeddings
    #: request, priced from its inputs: see ``_embeddings``).
    own_worst: bool = False
    #: The health epoch of the deployment when its latest attempt was placed: a failure
    #: of an attempt placed before a cooldown began does not lengthen that cooldown.
    placed_at: int | None = None
    #: Times an invalid answer was re-asked (a request with a schema, see ``structured``).
    reasks: int = 0
    #: Attempts made before the current ask: each ask has the whole retry policy.
    attempts_before: int = 0
    #: Earlier runs that got no valid answer for it (see ``InvalidOutputError.generation``).
    generation: int = 0
    #: Its span, with ``Engine(tracing=...)`` (see ``_tracing``); None otherwise.
    trace: RequestTrace | None = None
    #: Of ``tokens``, the output cap (``max_tokens``): what an output limit (``otpm``) is
    #: charged, the rest going to an input limit (``itpm``). 0 for embeddings.
    output: int = 0
    #: Its prompt-cache plan (see :mod:`sluice.caching`): its groups, breakpoints, key;
    #: None: sent as it came.
    cache: Planned | None = None

    @property
    def batch(self) -> bool:
        """Batch work (``map()``, embeddings packs): a stop sends it nothing new."""
        return self.index is not None

    @property
    def idempotency_key(self) -> str | None:
        """What the provider is sent as ``Idempotency-Key`` (see :func:`idempotency_key_of`)."""
        if self.key is None:
            return None
        # a re-ask is a new question: an Idempotency-Key honoured would hand back the old answer
        if not (self.reasks or self.generation):
            return idempotency_key_of(self.key)
        return idempotency_key_of(f"{self.key}\x1fgeneration-{self.generation}\x1freask-{self.reasks}")
