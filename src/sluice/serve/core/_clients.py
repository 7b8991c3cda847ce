"""Who may call the server: ``[[client]]`` keys, budgets and limits, and their spend on disk.

Keys (printable ASCII) are read from the environment at startup, kept as digests, compared in constant time
(:func:`hmac.compare_digest` against every client, so the time taken says nothing about
which key nearly matched) and never logged. A client's budget is a session budget of the
one engine (``engine.session``), so it counts against the server's own budget too; what it
spent (with what its requests in flight hold) is written to ``clients.db`` in the state
directory as each request is sent and settles, and added back at startup: a restart, even
a ``kill -9``, resets nothing.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..._budget import Budget
from ..._errors import ConfigError, StoreError
from ._batch_money import BatchMoney
from ._key_rules import check_key, warn_if_weak
from ._queue import ServeLimiter
from ._settings import ClientSpec

if TYPE_CHECKING:
    from ..._engine import Engine
    from ._redis import ServeRedis, ServeRedisLimiter

__all__ = ["DEFAULT_CLIENT", "Client", "Clients", "SpendStore"]

DEFAULT_CLIENT = "default"
#: The row that keeps the engine's own (server-wide) spend.
_ENGINE_ROW = ":engine"


@dataclass(eq=False, slots=True)
class Client:
    """An authenticated caller (the :class:`~sluice.serve.core._keys.ClientLike` of ``request[CLIENT]``)."""

    name: str
    budget: Budget | None = None
    #: Its own rpm/tpm, in front of the engine (None: only the deployments' limits apply).
    limiter: ServeLimiter | ServeRedisLimiter | None = None
    #: Model or deployment names it may use (None: every configured one).
    models: frozenset[str] | None = None
    _digest: bytes = field(default=b"", repr=False)
    #: Whose cached answers it may be given (see ``chat._cache``): its ``cache_group``, else its name.
    cache_group: str | None = None
    #: Its chat batches' money (None: it has no budget, nor the server; or ``--redis``).
    batches: BatchMoney | None = None

    @property
    def group(self) -> str:
        return self.cache_group if self.cache_group is not None else self.name

    def __repr__(self) -> str:
        return f"<Client {self.name}>"


class SpendStore:
    """Each client's dollars spent, in SQLite (a row per client; a write is one upsert)."""

    __slots__ = ("_db", "path")

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")  # WAL: a commit is durable against a crash of the process
            self._db.execute("PRAGMA busy_timeout=5000")
            self._db.execute("CREATE TABLE IF NOT EXISTS spend (client TEXT PRIMARY KEY, usd REAL NOT NULL)")
            # chat batches whose money is the engine store's charges (see ._batch_money)
            self._db.execute("CREATE TABLE IF NOT EXISTS batches (batch TEXT PRIMARY KEY, client TEXT NOT NULL)")
        except (sqlite3.Error, OSError) as exc:
            raise StoreError(f"cannot open the client spend file {path}: {exc}") from None

    def load(self, name: str) -> float:
        row = self._db.execute("SELECT usd FROM spend WHERE client = ?", (name,)).fetchone()
        return float(row[0]) if row else 0.0

    def save(self, rows: Iterable[tuple[str, float]]) -> None:
        try:
            self._db.executemany(
                "INSERT INTO spend (client, usd) VALUES (?, ?) ON CONFLICT(client) DO UPDATE SET usd = excluded.usd",
                list(rows),
            )
        except sqlite3.Error as exc:
            raise StoreError(f"cannot write the client spend file {self.path}: {exc}") from None

    def note_batch(self, batch_id: str, client: str) -> None:
        """``batch_id``'s lines are ``client``'s, their money in the engine's store."""
        try:
            self._db.execute("INSERT OR IGNORE INTO batches (batch, client) VALUES (?, ?)", (batch_id, client))
        except sqlite3.Error as exc:
            raise StoreError(f"cannot write the client spend file {self.path}: {exc}") from None

    def noted_batches(self) -> dict[str, str]:
        return dict(self._db.execute("SELECT batch, client FROM batches").fetchall())

    def close(self) -> None:
        self._db.close()


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


class Clients:
    """The configured clients (or the one loopback ``default`` client when there are none)."""

    __slots__ = ("_saved", "anonymous", "by_name", "engine_budget", "spend")

    def __init__(self, clients: Sequence[Client], spend: SpendStore, engine_budget: Budget | None) -> None:
        self.by_name = {c.name: c for c in clients}
        #: No [[client]] entries: no key is asked for, everyone is ``default``.
        self.anonymous = len(clients) == 1 and not clients[0]._digest
        self.spend = spend
        self.engine_budget = engine_budget
        self._saved: dict[str, float] = {}

    @classmethod
    def from_specs(
        cls,
        specs: Sequence[ClientSpec],
        engine: Engine,
        spend: SpendStore,
        environ: Mapping[str, str] | None = None,
        redis: ServeRedis | None = None,
        batch_spent: Mapping[str, float] | None = None,
    ) -> Clients:
        """Build the clients, reading each key from its variable (a missing one is a ConfigError).

        With ``redis`` (``--redis``) a client's budget and rpm/tpm are shared by every
        replica: its spend is Redis's (not ``clients.db``'s) and survives any replica.
        ``batch_spent``: what each client's chat batches were charged (see ``._batch_money``),
        counted with what ``clients.db`` says it spent."""
        env: Mapping[str, str] = os.environ if environ is None else environ
        engine_budget = engine.spending.budget
        batch_spent = {} if batch_spent is None else batch_spent
        if engine_budget is not None and redis is None:
            engine_budget.add_spent(spend.load(_ENGINE_ROW) + sum(batch_spent.values()))

        def money(name: str, budget: Budget | None) -> BatchMoney | None:
            parent = budget or engine_budget
            if redis is not None or parent is None:
                return None
            return BatchMoney(name, parent, spend.note_batch, batch_spent.get(name, 0.0))

        if not specs:
            return cls([Client(DEFAULT_CLIENT, batches=money(DEFAULT_CLIENT, None))], spend, engine_budget)
        clients: list[Client] = []
        seen: dict[bytes, str] = {}
        for spec in specs:
            key = env.get(spec.key_env, "")
            if not key:
                raise ConfigError(f"client {spec.name!r}: its key variable ${spec.key_env} is not set")
            check_key(key, f"client {spec.name!r}: the key in ${spec.key_env}")
            warn_if_weak(key, f"client {spec.name!r}: the key in ${spec.key_env}")
            digest = _digest(key)
            if digest in seen:
                raise ConfigError(f"clients {seen[digest]!r} and {spec.name!r} have the same key; give each its own")
            seen[digest] = spec.name
            budget = None
            name = f"client {spec.name}'s budget"
            if spec.budget_usd is not None and redis is not None:
                shared = redis.client_budget(spec.name, spec.budget_usd)
                budget = engine.session(spec.budget_usd, name=name, shared=shared).budget
            elif spec.budget_usd is not None:
                budget = engine.session(spec.budget_usd, name=name).budget
                budget.add_spent(spend.load(spec.name) + batch_spent.get(spec.name, 0.0))
            limiter: ServeLimiter | ServeRedisLimiter | None = None
            if redis is not None and (spec.rpm is not None or spec.tpm is not None):
                limiter = redis.client_limiter(spec)
            elif spec.rpm is not None or spec.tpm is not None:
                # A client's rpm/tpm is a quota, not a pacing: the whole minute may go at once.
                limiter = ServeLimiter(
                    requests=spec.rpm,
                    tokens=spec.tpm,
                    burst_requests=spec.rpm or 0.0,
                    burst_tokens=spec.tpm or 0.0,
                    name=f"client {spec.name}",
                )
            models = frozenset(spec.models) if spec.models is not None else None
            clients.append(
                Client(spec.name, budget, limiter, models, digest, spec.cache_group, money(spec.name, budget))
            )
        return cls(clients, spend, engine_budget)

    def client_spend(self) -> dict[str, tuple[float, float]]:
        """(spent, limit) of each client with a budget, as this process counts it."""
        return {c.name: (c.budget.spent(), c.budget.limit) for c in self.by_name.values() if c.budget is not None}

    def authenticate(self, key: str | None) -> Client | None:
        """The client whose key this is (constant time over all of them), else None."""
        if self.anonymous:
            return self.by_name[DEFAULT_CLIENT]
        if not key or not key.isascii():  # no client's (keys are ASCII), and it may not even encode
            return None
        digest = _digest(key)
        found: Client | None = None
        for client in self.by_name.values():  # every one is compared: no early exit to time
            if hmac.compare_digest(digest, client._digest):
                found = client
        return found

    def save(self) -> None:
        """Write what changed since the last save.

        What is written is spent *plus held*: the worst case of the requests in flight
        counts until they settle. Called as each request is granted (before it is sent),
        so a ``kill -9`` mid-request leaves on disk at least what the provider may bill;
        after a clean stop nothing is held and the figure is exact. A client's chat
        batches are left out: their money is the engine store's (see ``._batch_money``)."""
        rows: list[tuple[str, float]] = []
        batches = 0.0
        for client in self.by_name.values():
            held = client.batches.held() if client.batches is not None else 0.0
            batches += held
            if client.budget is not None:
                rows.append((client.name, client.budget.spent() + client.budget.reserved() - held))
        if self.engine_budget is not None:
            rows.append((_ENGINE_ROW, self.engine_budget.spent() + self.engine_budget.reserved() - batches))
        changed = [(name, usd) for name, usd in rows if self._saved.get(name) != usd]
        if changed:
            self.spend.save(changed)
            self._saved.update(changed)
