"""The provider-batch journal in the state: what was submitted to a provider's Batch API
and what came back, so that no crash submits a line twice.

Each chunk of lines is written here *before* its file is uploaded (``tier_chunks``, status
``submitting``), its batch id right after the batch is created (``submitted``); each
answered line's result line as soon as it is downloaded (``tier_results``), before the
engine stores it as an answer. A rerun reads the journal first: a line whose result was
downloaded is answered from it, a line of a batch still running waits for that batch, and
a chunk that crashed between creating its batch and recording the id is looked up at the
provider by the metadata it was created with (``sluice_job``, ``sluice_chunk``).

The tables are created on first write: older state files need no upgrade.
"""

from __future__ import annotations

import sqlite3
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from .. import _json
from .._models import idempotency_key_of

_T = TypeVar("_T")
_Op = Callable[[sqlite3.Connection], _T]

__all__ = [
    "Chunk",
    "chunk_counts_op",
    "chunk_ids_op",
    "chunk_states_op",
    "chunks_op",
    "has_tables_op",
    "job_id_op",
    "line_state_op",
    "new_chunk_op",
    "note_batch_op",
    "save_results_op",
    "saved_lines_op",
]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS tier_chunks (
    id INTEGER PRIMARY KEY,
    deployment TEXT NOT NULL,
    custom_ids TEXT NOT NULL,
    batch_id TEXT,
    status TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS tier_lines (
    custom_id TEXT PRIMARY KEY,
    chunk INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS tier_results (
    custom_id TEXT PRIMARY KEY,
    chunk INTEGER NOT NULL,
    batch_id TEXT NOT NULL,
    line BLOB NOT NULL
);
"""


@dataclass(frozen=True, slots=True)
class Chunk:
    """One submission: its lines' custom ids, and the provider's batch once created."""

    id: int
    deployment: str
    custom_ids: tuple[str, ...]
    batch_id: str | None
    #: ``submitting`` (recorded, maybe uploaded or created), ``submitted`` (the batch id
    #: is known), ``collected`` (every line's outcome is in ``tier_results`` or was
    #: handed back to be sent again), ``abandoned`` (no batch was ever created for it).
    status: str
    created_at: float


def _ensure(db: sqlite3.Connection) -> None:
    had_lines = db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'tier_lines'").fetchone()
    if had_lines:
        return
    for statement in _SCHEMA.split(";"):  # not executescript: it would commit the writer's transaction
        if statement.strip():
            db.execute(statement)
    # a state from before tier_lines: the lines of its open chunks are indexed once
    db.execute(
        "INSERT OR REPLACE INTO tier_lines (custom_id, chunk) SELECT j.value, c.id FROM tier_chunks c,"
        " json_each(c.custom_ids) j WHERE c.status IN ('submitting', 'submitted') ORDER BY c.id"
    )


def _has_tables(db: sqlite3.Connection) -> bool:
    row = db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'tier_chunks'").fetchone()
    return row is not None


def job_id_op(db: sqlite3.Connection) -> str:
    """This job's id for the provider's batch metadata: made once, kept in the state."""
    row = db.execute("SELECT value FROM meta WHERE name = 'batch_job_id'").fetchone()
    if row is not None:
        return str(_json.loads(row[0]))
    job = uuid.uuid4().hex[:16]
    db.execute("INSERT INTO meta (name, value) VALUES ('batch_job_id', ?)", (_json.dumps(job).decode(),))
    return job


def new_chunk_op(deployment: str, custom_ids: Sequence[str]) -> _Op[int]:
    def op(db: sqlite3.Connection) -> int:
        _ensure(db)
        row = (deployment, _json.dumps(list(custom_ids)).decode(), "submitting", time.time())
        insert = "INSERT INTO tier_chunks (deployment, custom_ids, status, created_at) VALUES (?,?,?,?)"
        cursor = db.execute(insert, row)
        assert cursor.lastrowid is not None
        chunk = cursor.lastrowid
        db.executemany(
            "INSERT OR REPLACE INTO tier_lines (custom_id, chunk) VALUES (?, ?)",
            [(custom_id, chunk) for custom_id in custom_ids],
        )
        return chunk

    return op


def note_batch_op(chunk: int, batch_id: str | None, status: str) -> _Op[None]:
    def op(db: sqlite3.Connection) -> None:
        _ensure(db)
        db.execute("UPDATE tier_chunks SET batch_id = ?, status = ? WHERE id = ?", (batch_id, status, chunk))

    return op


def save_results_op(chunk: int, batch_id: str, lines: Sequence[tuple[str, bytes]]) -> _Op[None]:
    def op(db: sqlite3.Connection) -> None:
        _ensure(db)
        db.executemany(
            "INSERT OR REPLACE INTO tier_results (custom_id, chunk, batch_id, line) VALUES (?,?,?,?)",
            [(custom_id, chunk, batch_id, line) for custom_id, line in lines],
        )

    return op


def chunks_op(db: sqlite3.Connection, deployment: str | None) -> list[Chunk]:
    """The chunks of ``deployment`` (of every deployment: None) not yet collected."""
    if not _has_tables(db):
        return []
    rows = db.execute(
        "SELECT id, deployment, custom_ids, batch_id, status, created_at FROM tier_chunks"
        " WHERE (? IS NULL OR deployment = ?) AND status IN ('submitting', 'submitted') ORDER BY id",
        (deployment, deployment),
    ).fetchall()
    return [Chunk(r[0], r[1], tuple(_json.loads(r[2])), r[3], r[4], r[5]) for r in rows]


def chunk_counts_op(db: sqlite3.Connection) -> list[tuple[str, str, int, int]]:
    """(deployment, status, chunks, lines) over every chunk the job journalled."""
    if not _has_tables(db):
        return []
    rows = db.execute(
        "SELECT deployment, status, count(*), coalesce(sum(json_array_length(custom_ids)), 0) FROM tier_chunks"
        " GROUP BY deployment, status ORDER BY deployment, status"
    ).fetchall()
    return [(str(r[0]), str(r[1]), int(r[2]), int(r[3])) for r in rows]


def forget_batched_intents_op(db: sqlite3.Connection) -> int:
    """Drop the open intents of lines that wait in a recorded provider batch: the rerun
    follows the batch, and the line is billed once, when collected (its new attempt is
    counted then). Lines of a chunk with no recorded batch keep their worst case (the
    batch may exist unfound). How many were dropped."""
    if not _has_tables(db):
        return 0
    waiting: set[str] = set()
    for (custom_ids,) in db.execute("SELECT custom_ids FROM tier_chunks WHERE status = 'submitted'"):
        waiting.update(_json.loads(custom_ids))
    if not waiting:
        return 0
    batched = [i for i, key in db.execute("SELECT id, key FROM intents") if idempotency_key_of(key) in waiting]
    for start in range(0, len(batched), 500):
        part = batched[start : start + 500]
        db.execute(f"DELETE FROM intents WHERE id IN ({','.join('?' * len(part))})", part)
    return len(batched)


def line_state_op(db: sqlite3.Connection, custom_id: str) -> tuple[tuple[str, bytes, int] | None, int | None]:
    """In one query (it is made for every line sent): ``custom_id``'s downloaded result
    line, its batch and chunk, if any, and the last chunk that took it, if any. The tables must
    exist. (A chunk's own row is not read here: its columns after ``custom_ids`` sit
    behind that list's overflow pages, ~0.1 ms a read; see ``chunk_states_op``.)"""
    row = db.execute(
        "SELECT r.batch_id, r.line, r.chunk, l.chunk FROM (SELECT ? AS id) q"
        " LEFT JOIN tier_results r ON r.custom_id = q.id LEFT JOIN tier_lines l ON l.custom_id = q.id",
        (custom_id,),
    ).fetchone()
    saved = None if row[0] is None else (str(row[0]), bytes(row[1]), int(row[2]))
    return saved, None if row[3] is None else int(row[3])


def saved_lines_op(db: sqlite3.Connection, custom_ids: Sequence[str]) -> dict[str, tuple[str, bytes, int]]:
    """The downloaded result lines of ``custom_ids`` that have one: (batch id, line, chunk) by
    custom id, one query per 500 ids (a write-back asks for a wave of lines at once, where
    ``line_state_op`` is a query a line)."""
    found: dict[str, tuple[str, bytes, int]] = {}
    for start in range(0, len(custom_ids), 500):
        part = custom_ids[start : start + 500]
        marks = ",".join("?" * len(part))
        query = f"SELECT custom_id, batch_id, line, chunk FROM tier_results WHERE custom_id IN ({marks})"
        rows = db.execute(query, part)
        for custom_id, batch_id, line, chunk in rows:
            found[custom_id] = (batch_id, line, chunk)
    return found


def chunk_states_op(db: sqlite3.Connection) -> dict[int, Chunk]:
    """Every chunk's state (custom ids not read), read once and then kept by the store."""
    if not _has_tables(db):
        return {}
    rows = db.execute("SELECT id, deployment, batch_id, status, created_at FROM tier_chunks").fetchall()
    return {r[0]: Chunk(r[0], r[1], (), r[2], r[3], r[4]) for r in rows}


def has_tables_op(db: sqlite3.Connection) -> bool:
    """Whether the journal's tables are there (every one of them: made together)."""
    row = db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'tier_lines'").fetchone()
    return row is not None


def chunk_ids_op(db: sqlite3.Connection, chunk: int) -> tuple[str, ...]:
    """The custom ids ``chunk`` was submitted with."""
    if not _has_tables(db):
        return ()
    row = db.execute("SELECT custom_ids FROM tier_chunks WHERE id = ?", (chunk,)).fetchone()
    return () if row is None else tuple(_json.loads(row[0]))
