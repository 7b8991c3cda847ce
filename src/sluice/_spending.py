"""The engine's money: prices, budgets, and the rule that switches to a cheaper model.

Kept apart from the engine's loop so that the loop reads as the request's way through
the system: ``prepare`` at admission, ``reserve`` before the first attempt, ``settle``
when the outcome is known.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass

from ._budget import (
    Budget,
    BudgetExhaustedError,
    BudgetHold,
    BudgetLedger,
    SharedBudget,
    SharedHold,
    UnknownPriceError,
)
from ._errors import ConfigError
from ._models import Deployment, Request, Usage
from ._pricing import Pricing
from ._tokens import max_prompt_tokens
from .caching._marks import asks_an_hour
from .providers._base import max_output_tokens
from .structured._ask import sent_params

__all__ = ["CheaperModel", "Spending", "capped", "worst_case_tokens"]


@dataclass(frozen=True, slots=True)
class CheaperModel:
    """Below ``below_usd`` remaining, requests for a key of ``use`` go to its value instead.

    ``CheaperModel({"openai/gpt-4o": "openai/gpt-4o-mini"}, below_usd=1.0)``: an agent keeps
    working, more cheaply, as its budget runs low.
    """

    use: Mapping[str, str]
    below_usd: float

    def __post_init__(self) -> None:
        if not isinstance(self.below_usd, (int, float)) or self.below_usd < 0:
            raise ConfigError(f"CheaperModel.below_usd must be a number >= 0, got {self.below_usd!r}")
        if not self.use:
            raise ConfigError("CheaperModel.use needs at least one {expensive: cheaper} pair")


class Spending:
    """Prices for every result; with a budget, reservations that cannot be overshot.

    With a ``shared`` budget (one other processes use too, e.g. ``RedisBudget``) every
    request under the engine's budget also holds its worst case there, after the local
    hold, and settles both with the same cost. The local ``budget`` then stands for this
    process's share of it: limited by ``budget_usd`` when given, else by the shared limit.
    A session's budget may carry a shared budget of its own (``session(..., shared=)``):
    a request then holds in every shared budget of its chain, all or none.
    """

    __slots__ = (
        "_follow",
        "_paid",
        "_parked",
        "_parked_whole",
        "_shared_all",
        "allow_unpriced",
        "budget",
        "cheaper",
        "ledger",
        "pricing",
        "shared",
        "unpriced_models",
    )

    def __init__(
        self,
        budget_usd: float | None,
        *,
        allow_unpriced: bool = False,
        cheaper: CheaperModel | None = None,
        shared: SharedBudget | None = None,
    ) -> None:
        self.pricing = Pricing()
        self.shared = shared
        #: Without ``budget_usd`` the local budget follows the shared limit (it may change).
        self._follow = budget_usd is None and shared is not None
        if budget_usd is None and shared is not None:
            budget_usd = shared.limit
        self.budget = Budget(budget_usd, name="the budget", shared=shared) if budget_usd is not None else None
        #: Every shared budget of this engine's budgets (empty: the local path, one check).
        self._shared_all: list[SharedBudget] = [shared] if shared is not None and self.budget is not None else []
        self.ledger = BudgetLedger()
        self.allow_unpriced = allow_unpriced
        self.cheaper = cheaper
        #: Models that answered without a known price: reported, never counted as free.
        self.unpriced_models: set[str] = set()
        #: Holds of parked requests (see :meth:`park`): per budget, one merged hold and
        #: each request's share by its key's hash.
        self._parked: dict[int, tuple[BudgetHold, dict[int, float]]] = {}
        self._parked_whole: dict[int, BudgetHold] = {}
        #: Parked requests whose batch's bill was counted when its results came (see
        #: :meth:`settle_parked`), by the key's hash: what it was, until they are asked again.
        self._paid: dict[int, float] = {}

    def session(self, budget_usd: float, name: str, shared: SharedBudget | None = None) -> Budget:
        if shared is not None:
            self._shared_all.append(shared)
        return Budget(budget_usd, parent=self.budget, name=name, shared=shared)

    def choose_model(self, request: Request, budget: Budget | None) -> Request:
        """The cheaper model's request once the budget runs below the rule's threshold."""
        if self.cheaper is None or budget is None:
            return request
        cheaper = self.cheaper.use.get(request.model)
        if cheaper is None or budget.remaining() >= self.cheaper.below_usd:
            return request
        return dataclasses.replace(request, model=cheaper)

    def prepare(self, request: Request, deployment: Deployment, budget: Budget | None) -> tuple[Request, float]:
        """The request as it will be sent, and the most it may cost (0 without a budget).

        Under a budget, output must be capped for the worst case to mean anything, so a
        request without ``max_tokens`` gets the deployment's ``default_max_tokens``.
        """
        if budget is None:
            return request, 0.0
        request = capped(request, deployment)
        hour = asks_an_hour(request)  # an hour-long cache write bills twice the input price
        worst = self.pricing.worst_case(deployment, *worst_case_tokens(request, deployment), hour=hour)
        if worst is None:
            if not self.allow_unpriced:
                raise UnknownPriceError(
                    f"model {deployment.model!r} has no known price and this run has a budget; "
                    "set a price for its deployment, or allow unpriced models"
                )
            return request, 0.0
        return request, worst

    def worst_cost(self, request: Request, deployment: Deployment, *, hour: bool = False) -> float:
        """The most ``request`` can cost as it will be sent (0.0 when its price is unknown);
        ``hour``: it will be marked to write the cache for an hour.

        Without an output cap it is priced at ``deployment.default_max_tokens``, the cap a
        budgeted run sends it with.
        """
        hour = hour or asks_an_hour(request)
        return self.pricing.worst_case(deployment, *worst_case_tokens(request, deployment), hour=hour) or 0.0

    def check_priced(self, deployment: Deployment) -> None:
        """Look the price up now; under a budget, refuse a deployment with none (unless allowed)."""
        if self.pricing.known(deployment) is None and self.budget is not None and not self.allow_unpriced:
            raise UnknownPriceError(
                f"model {deployment.model!r} has no known price and this run has a budget; "
                "set a price for its deployment (--price IN,OUT), or allow unpriced models (--allow-unpriced)"
            )

    async def reserve(self, budget: Budget | None, worst: float) -> BudgetHold | None:
        if budget is None:
            return None
        hold = await self.ledger.reserve(budget, worst)
        if not self._shared_all:
            return hold
        shared = [b.shared for b in hold.chain if b.shared is not None]
        if not shared:
            return hold
        taken: list[SharedHold] = []
        try:
            for each in shared:
                taken.append(await each.reserve(worst))
        except BaseException as exc:
            if isinstance(exc, BudgetExhaustedError):
                self.ledger.exhausted = True
            for each_hold in taken:
                each_hold.commit(0.0)
            hold.release()
            raise
        finally:
            if self._follow and self.budget is not None and self.shared is not None:
                self.budget.limit = self.shared.limit
        hold.shared = tuple(taken)
        return hold

    def park(self, key: str, hold: BudgetHold) -> None:
        """Keep a parked request's hold (its worst case stays reserved while the provider
        holds it) until :meth:`unpark`. Merged into one hold per budget, with the share
        kept by the key's hash: a parked request costs ~100 bytes here, so a million of
        them at a provider do not fill memory. A hold on a shared budget stays whole."""
        if hold.shared:  # a shared budget's hold cannot be merged: kept as it is
            if hash(key) in self._parked_whole:  # an identical request's: one answer, billed once
                hold.release()
            else:
                self._parked_whole[hash(key)] = hold
            return
        place = id(hold.chain[0])
        entry = self._parked.get(place)
        if entry is None:
            self._parked[place] = (hold, {hash(key): hold.amount})
            return
        merged, shares = entry
        merged.absorb(hold)
        shares[hash(key)] = shares.get(hash(key), 0.0) + hold.amount

    @property
    def holds_parked(self) -> bool:
        """Whether any parked request's hold (or paid bill) is kept here."""
        return bool(self._parked or self._parked_whole or self._paid)

    def unpark(self, budget: Budget, key: str, worst: float) -> BudgetHold | None:
        """The hold ``key`` left when it was parked, now its own again (None: none was
        kept, or it no longer covers ``worst``: then it is released and the caller reserves).
        A request whose batch's bill was counted already gets a hold of nothing that knows it."""
        paid = self._paid.pop(hash(key), None)
        if paid is not None:
            return self.ledger.paid_hold(budget, paid)
        part = self._take_parked(key, id(budget))
        if part is not None and part.amount + 1e-12 < worst:
            part.release()
            return None
        return part

    def settle_parked(self, key: str, cost: float | None) -> None:
        """A parked request's batch is over: it cost ``cost`` there (its answer or its
        rejection is kept, and the request, asked again, is answered from it), or None:
        the batch did not answer it (not billed; asked again, it reserves afresh). Its hold
        is settled now, not when it is asked again: the money of a batch that has ended
        must not wait for its lines to come back into the engine (they may be waiting for
        room that requests waiting for that money hold)."""
        for place in [None, *self._parked]:
            hold = self._take_parked(key, place)
            if hold is not None:
                break
        else:
            return  # not parked (asked again already, or never)
        hold.commit(cost or 0.0)
        if cost is not None:
            self._paid[hash(key)] = cost

    def take_paid(self, key: str) -> float | None:
        """What a parked request's batch billed for it, counted when its results came (see
        :meth:`settle_parked`), taken out: its answer is written without being asked again.
        None: nothing was counted for it here (it is asked again, and reserves then)."""
        return self._paid.pop(hash(key), None)

    def _take_parked(self, key: str, place: int | None) -> BudgetHold | None:
        """The parked hold of ``key``, taken out: a whole one (``place`` None) or its share
        of the merged hold of the budget at ``place``."""
        whole = self._parked_whole.pop(hash(key), None)
        if whole is not None or place is None:
            return whole
        entry = self._parked.get(place)
        share = entry[1].pop(hash(key), None) if entry is not None else None
        if entry is None or share is None:
            return None
        merged, shares = entry
        part = merged.split(share)
        if not shares:  # the last of them: what float sums left over goes back
            del self._parked[place]
            merged.release()
        return part

    async def flush(self) -> None:
        """Wait until every settle of a shared budget has reached it (at close)."""
        for shared in self._shared_all:
            await shared.flush()

    def cost(self, deployment: Deployment, usage: Usage) -> float | None:
        cost = self.pricing.cost(deployment, usage)
        if cost is None:
            self.unpriced_models.add(deployment.label)
        return cost

    def remaining(self) -> float:
        return math.inf if self.budget is None else self.budget.remaining()


def worst_case_tokens(request: Request, deployment: Deployment) -> tuple[int, int]:
    """(most prompt tokens the provider can bill, most output tokens): a budget's worst case.

    The prompt is :func:`~sluice._tokens.max_prompt_tokens` (a bound that holds for any
    byte-level BPE tokenizer, images by the provider's formula), not the ~4-characters
    estimate used for rate limits: a tokenizer that counts more than the estimate would
    otherwise overshoot the budget.
    """
    prompt = max_prompt_tokens(
        request.messages, sent_params(request), provider=deployment.provider_name, model=deployment.model_name
    )
    return prompt, max_output_tokens(request, deployment)


def capped(request: Request, deployment: Deployment) -> Request:
    """``request`` as a budgeted run sends it: with the deployment's ``default_max_tokens``
    when it gives no output cap (a worst case needs one)."""
    if request.max_tokens is None and _output_cap(request) is None:
        return dataclasses.replace(request, max_tokens=deployment.default_max_tokens)
    return request


def _output_cap(request: Request) -> int | None:
    """An output cap a chat API honours, given in ``params`` (``max_output_tokens`` is not one)."""
    for key in ("max_completion_tokens", "max_tokens"):
        value = request.params.get(key)
        if isinstance(value, int) and value > 0:
            return value
    return None
