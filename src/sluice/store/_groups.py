"""Money by group of requests: a request whose id is ``<group>/<rest>`` (``sluice serve``
names a batch's lines ``<batch id>/<custom_id>``) counts in its group. Read from the
``charges`` (written with each answer, in the same transaction), so what a crash leaves is
exactly what was charged."""

from __future__ import annotations

import sqlite3

__all__ = ["spend_by_group_op"]

#: A key is ``<id>\x1f<content>`` for a request with an id: its group is the id up to a ``/``.
_BY_GROUP = (
    "SELECT substr(key, 1, instr(key, '/') - 1), sum(answered_usd + maybe_billed_usd) FROM charges"
    " WHERE instr(key, '/') > 1 AND instr(key, char(31)) > instr(key, '/') GROUP BY 1"
)


def spend_by_group_op(db: sqlite3.Connection) -> dict[str, float]:
    """Dollars charged per group (answers, and failures that may have been billed)."""
    if db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'charges'").fetchone() is None:
        return {}
    return {str(group): float(usd) for group, usd in db.execute(_BY_GROUP)}
