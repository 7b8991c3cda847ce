"""Embeddings in the state: one row per text, its vector as float32 bytes.

A chat answer is a JSON record; a vector as JSON numbers would take ~12 bytes a dimension
(1536 dimensions: ~20 KB a text, 20 GB for a million). So vectors live in a table of
their own, ``embeddings``, as BLOBs of float32 (4 bytes a dimension, little-endian, as
OpenAI's base64 encoding carries them): 6 KB per 1536-dimension text. Each row is keyed
by the text's key (model, text and parameters; see ``sluice._embeddings.embedding_key``),
so the same text in another job, line or run is served from the store instead of sent.

A text the provider rejected (a 400 about that text alone) is stored too, with its
error, so a rerun keeps it like a chat request's rejection (``--retry-failed`` sends it
again). Other failures are not stored: a rerun redoes them.

The table is created on first write, so a state file written by an older sluice (or a
chat-only job) needs no upgrade; reads of a file without it find nothing.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from .. import _json

__all__ = ["StoredVector", "VectorStore", "get_vectors", "put_vectors_op"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS embeddings (
    key TEXT PRIMARY KEY,
    ok INTEGER NOT NULL,
    dims INTEGER NOT NULL DEFAULT 0,
    vector BLOB,
    input_tokens INTEGER NOT NULL DEFAULT 0,
    cost_usd REAL,
    attempts INTEGER NOT NULL DEFAULT 0,
    latency_s REAL NOT NULL DEFAULT 0,
    deployment TEXT,
    error TEXT,
    finished_at REAL NOT NULL
)
"""
_PUT = (
    "INSERT OR REPLACE INTO embeddings (key, ok, dims, vector, input_tokens, cost_usd, attempts, latency_s,"
    " deployment, error, finished_at) VALUES (?,?,?,?,?,?,?,?,?,?,?)"
)
#: Keys per SELECT: well under SQLite's limit on bound parameters (32,766 since 3.32).
_CHUNK = 500


@dataclass(frozen=True, slots=True)
class StoredVector:
    """One text's stored outcome: its vector (float32 little-endian bytes), or the error
    the provider rejected it with."""

    vector: bytes | None
    input_tokens: int = 0
    cost_usd: float | None = None
    attempts: int = 0
    latency_s: float = 0.0
    deployment: str | None = None
    #: The error record (``sluice._records.error_record``) of a rejected text.
    error: Mapping[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.vector is not None

    @property
    def dims(self) -> int:
        return len(self.vector) // 4 if self.vector is not None else 0


@runtime_checkable
class VectorStore(Protocol):
    """A store that can hold embeddings (:class:`~sluice.store.SqliteStore` can)."""

    def get_vectors(self, keys: Sequence[str]) -> dict[str, StoredVector]:
        """The stored outcome of each of ``keys`` that has one."""
        ...

    async def put_vectors(self, rows: Sequence[tuple[str, StoredVector]]) -> None:
        """Record outcomes durably before returning."""
        ...


def get_vectors(db: sqlite3.Connection, keys: Sequence[str]) -> dict[str, StoredVector]:
    found: dict[str, StoredVector] = {}
    for start in range(0, len(keys), _CHUNK):
        chunk = list(dict.fromkeys(keys[start : start + _CHUNK]))
        marks = ",".join("?" * len(chunk))
        query = (
            "SELECT key, vector, input_tokens, cost_usd, attempts, latency_s, deployment, error"
            f" FROM embeddings WHERE key IN ({marks})"
        )
        try:
            rows = db.execute(query, chunk).fetchall()
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return {}  # nothing embedded in this state yet
            raise
        for key, vector, tokens, cost, attempts, latency, deployment, error in rows:
            found[key] = StoredVector(
                bytes(vector) if vector is not None else None,
                int(tokens),
                cost,
                int(attempts),
                float(latency),
                deployment,
                _json.loads(error) if error else None,
            )
    return found


def put_vectors_op(rows: Sequence[tuple[str, StoredVector]]) -> Any:
    """A writer op storing ``rows`` (and the table, the first time)."""
    now = time.time()
    values = [
        (
            key,
            int(row.ok),
            row.dims,
            row.vector,
            row.input_tokens,
            row.cost_usd,
            row.attempts,
            row.latency_s,
            row.deployment,
            _json.dumps_text(row.error) if row.error is not None else None,
            now,
        )
        for key, row in rows
    ]

    def op(db: sqlite3.Connection) -> None:
        db.execute(_SCHEMA)
        db.executemany(_PUT, values)

    return op
