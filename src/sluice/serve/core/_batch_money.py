"""What a client's chat batches spend, kept where a ``kill -9`` cannot make it wrong.

A client's spend on disk (``clients.db``) is a snapshot, written as requests are granted:
what was spent plus what requests in flight hold (their worst case), so a crash never
lets a client spend the same money again. For a line waiting in a provider's batch that
is wrong the other way: the restart follows the batch (as ``sluice run --tier batch``
does, see ``sluice.tiers``) and charges the line when it is answered, so its worst case
held at the crash would be counted twice, and a tight budget would refuse every line the
provider had answered and billed.

So a chat batch's money is not in the snapshot. Its lines run under the client's
:class:`BatchMoney` (a budget inside the client's, with no limit of its own), which the
snapshot leaves out, and the batch is noted in ``clients.db`` before its first line is
sent. What its lines cost is the engine store's charges, written with each answer in
the same transaction (``SqliteStore.spend_by_group``: the lines' ids are
``<batch id>/<custom_id>``); at startup those of every noted batch are counted back
(:func:`batch_spend`), after the lines left in flight by a crash have been settled as
``sluice run`` settles them (``SqliteStore.recover_intents``: a line in a provider batch
is charged when collected, any other at its worst case).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..._budget import Budget

if TYPE_CHECKING:
    from ...store import SqliteStore

__all__ = ["BatchMoney", "batch_spend"]


class BatchMoney:
    """One client's chat batches: their budget (inside the client's) and how a batch is noted."""

    __slots__ = ("_note", "budget", "client")

    def __init__(self, client: str, parent: Budget, note: Callable[[str, str], None], spent: float = 0.0) -> None:
        self.client = client
        #: No limit of its own: the client's (and the server's) hold.
        self.budget = Budget(math.inf, parent=parent, name=parent.name)
        self.budget.add_spent(spent)  # counted back at startup (the parent has it too)
        self._note = note

    def note(self, batch_id: str) -> None:
        """Before the batch's first line goes: its charges are this client's at startup."""
        self._note(batch_id, self.client)

    def held(self) -> float:
        """Spent and reserved by the batches: what the client's snapshot leaves out."""
        return self.budget.spent() + self.budget.reserved()


def batch_spend(store: SqliteStore, noted: dict[str, str]) -> dict[str, float]:
    """Each client's chat batches' charges in the engine's store, after settling what a
    crash left in flight (``noted``: batch id -> client)."""
    store.recover_intents()
    spent: dict[str, float] = {}
    for group, usd in store.spend_by_group().items():
        client = noted.get(group)
        if client is not None:
            spent[client] = spent.get(client, 0.0) + usd
    return spent
