"""The Batch API's bookkeeping: file and batch objects in one SQLite file under the state dir.

Rows are few and small (one per file, one per batch), written when an object is created or
changes status, so plain synchronous ``sqlite3`` calls on the event loop cost microseconds;
the per-line results of a running batch go elsewhere (a :class:`~sluice.store.SqliteStore`
per batch, written off the loop: see ``batches._run``). WAL with ``synchronous=NORMAL``
survives a killed process, which is what a restart of ``sluice serve`` needs.

Every lookup names the client: one client never sees another's files or batches.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..._errors import StoreError
from ..core._state_db import open_state_db

__all__ = ["INTERNAL_PURPOSES", "BatchDB", "FileRow"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT UNIQUE NOT NULL,
    client TEXT NOT NULL,
    filename TEXT NOT NULL,
    purpose TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    lines INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS batches (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT UNIQUE NOT NULL,
    client TEXT NOT NULL,
    status TEXT NOT NULL,
    body TEXT NOT NULL
);
"""

#: Statuses of a batch that still has work to do (resumed at startup).
ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")
#: Files a Message Batch keeps for itself (its requests as a batch file, its results):
#: never listed or served by ``/v1/files``, since the client did not make them there.
INTERNAL_PURPOSES = ("message_batch", "message_batch_results")


@dataclass(frozen=True, slots=True)
class FileRow:
    id: str
    client: str
    filename: str
    purpose: str
    bytes: int
    created_at: int
    #: Requests in a ``batch`` file (counted when it was uploaded).
    lines: int = 0
    #: When the file is deleted (None: never; a Message Batch's own go with their batch).
    expires_at: int | None = None

    def to_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "file",
            "bytes": self.bytes,
            "created_at": self.created_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "status_details": None,
            "expires_at": self.expires_at,
        }


class BatchDB:
    """Files and batches, by client. ``file_ttl_s``: a file (not a Message Batch's own)
    added without an ``expires_at`` expires so long after it was made (0: never)."""

    def __init__(self, path: Path, file_ttl_s: float = 0) -> None:
        self.path = path
        self.file_ttl_s = int(file_ttl_s)
        self._db = open_state_db(path, _SCHEMA, "the batch state")
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(files)")}
        if "expires_at" not in columns:  # a state dir from before files expired
            self._run("ALTER TABLE files ADD COLUMN expires_at INTEGER", ())

    def close(self) -> None:
        self._db.close()

    # -- files -------------------------------------------------------------------------------

    def add_file(self, row: FileRow) -> FileRow:
        """``row`` recorded (with its ``expires_at``, when the file expires): as recorded."""
        row = self._expiring(row)
        self._run(
            "INSERT OR REPLACE INTO files (id, client, filename, purpose, bytes, created_at, lines, expires_at)"
            " VALUES (?,?,?,?,?,?,?,?)",
            (row.id, row.client, row.filename, row.purpose, row.bytes, row.created_at, row.lines, row.expires_at),
        )
        return row

    def holdings(self, client: str) -> tuple[int, int]:
        """(files, bytes) ``client`` holds on this server, its batches' output included."""
        files, size = self._db.execute(
            "SELECT COUNT(*), COALESCE(SUM(bytes), 0) FROM files WHERE client = ?", (client,)
        ).fetchone()
        return int(files), int(size)

    def expired(self, now: float) -> list[FileRow]:
        """Files whose time is up (those made before files expired: ``file_ttl_s`` after they were)."""
        marks = ",".join("?" * len(INTERNAL_PURPOSES))
        if self.file_ttl_s:
            clause = f"WHERE purpose NOT IN ({marks}) AND COALESCE(expires_at, created_at + ?) <= ?"
            args: tuple[Any, ...] = (*INTERNAL_PURPOSES, self.file_ttl_s, now)
        else:
            clause = f"WHERE purpose NOT IN ({marks}) AND expires_at IS NOT NULL AND expires_at <= ?"
            args = (*INTERNAL_PURPOSES, now)
        return list(self._files(clause, args))

    def file(self, client: str, file_id: str) -> FileRow | None:
        rows = list(self._files("WHERE client = ? AND id = ?", (client, file_id)))
        return rows[0] if rows else None

    def files(
        self, client: str, *, purpose: str | None, after: str | None, limit: int, descending: bool
    ) -> list[FileRow]:
        marks = ",".join("?" * len(INTERNAL_PURPOSES))
        where = f"WHERE client = ? AND purpose NOT IN ({marks})"
        args: list[Any] = [client, *INTERNAL_PURPOSES]
        if purpose is not None:
            where += " AND purpose = ?"
            args.append(purpose)
        if after is not None:
            cursor = self._db.execute("SELECT seq FROM files WHERE client = ? AND id = ?", (client, after)).fetchone()
            if cursor is not None:
                where += " AND seq < ?" if descending else " AND seq > ?"
                args.append(cursor[0])
        order = "DESC" if descending else "ASC"
        return list(self._files(f"{where} ORDER BY seq {order} LIMIT ?", (*args, limit)))

    def delete_file(self, client: str, file_id: str) -> bool:
        cursor = self._run("DELETE FROM files WHERE client = ? AND id = ?", (client, file_id))
        return cursor.rowcount > 0

    def _files(self, clause: str, args: tuple[Any, ...]) -> Iterator[FileRow]:
        query = f"SELECT id, client, filename, purpose, bytes, created_at, lines, expires_at FROM files {clause}"
        for row in self._db.execute(query, args):
            yield self._expiring(FileRow(*row))

    def _expiring(self, row: FileRow) -> FileRow:
        """``row`` with the server's expiry when it has none of its own."""
        if row.expires_at is None and self.file_ttl_s and row.purpose not in INTERNAL_PURPOSES:
            return dataclasses.replace(row, expires_at=row.created_at + self.file_ttl_s)
        return row

    # -- batches -----------------------------------------------------------------------------

    def save_batch(self, client: str, batch: dict[str, Any]) -> None:
        """Insert or update a batch object (its row keeps its place in the listing)."""
        body = json.dumps(batch)
        cursor = self._run("UPDATE batches SET status = ?, body = ? WHERE id = ?", (batch["status"], body, batch["id"]))
        if cursor.rowcount == 0:
            self._run(
                "INSERT INTO batches (id, client, status, body) VALUES (?,?,?,?)",
                (batch["id"], client, batch["status"], body),
            )

    def batch(self, client: str, batch_id: str) -> dict[str, Any] | None:
        row = self._db.execute("SELECT body FROM batches WHERE client = ? AND id = ?", (client, batch_id)).fetchone()
        return json.loads(row[0]) if row is not None else None

    def batches(
        self, client: str, *, after: str | None, limit: int, before: str | None = None, prefix: str = "batch_"
    ) -> list[dict[str, Any]]:
        """Newest first, as OpenAI and Anthropic list them: the ones after ``after`` (the
        previous page's last id), or the ``limit`` just before ``before`` (a page back).
        ``prefix``: only ids of that kind (``batch_`` for OpenAI's, ``msgbatch_`` for
        Anthropic's), each API listing its own."""
        where = "WHERE client = ? AND substr(id, 1, ?) = ?"
        args: list[Any] = [client, len(prefix), prefix]
        order = "DESC"
        for cursor_id, newer in ((after, False), (before, True)):
            if cursor_id is None:
                continue
            cursor = self._db.execute(
                "SELECT seq FROM batches WHERE client = ? AND id = ?", (client, cursor_id)
            ).fetchone()
            if cursor is not None:
                where += " AND seq > ?" if newer else " AND seq < ?"
                args.append(cursor[0])
                order = "ASC" if newer else order
        query = f"SELECT body FROM batches {where} ORDER BY seq {order} LIMIT ?"
        rows = [json.loads(row[0]) for row in self._db.execute(query, (*args, limit))]
        return rows[::-1] if order == "ASC" else rows

    def delete_batch(self, client: str, batch_id: str) -> bool:
        cursor = self._run("DELETE FROM batches WHERE client = ? AND id = ?", (client, batch_id))
        return cursor.rowcount > 0

    def recent(self, limit: int) -> list[tuple[str, dict[str, Any]]]:
        """(client, batch) of the newest batches of every client (for the dashboard)."""
        query = "SELECT client, body FROM batches ORDER BY seq DESC LIMIT ?"
        return [(row[0], json.loads(row[1])) for row in self._db.execute(query, (limit,))]

    def active(self) -> list[tuple[str, dict[str, Any]]]:
        """(client, batch) of every batch with work left, oldest first."""
        marks = ",".join("?" * len(ACTIVE))
        query = f"SELECT client, body FROM batches WHERE status IN ({marks}) ORDER BY seq"
        return [(row[0], json.loads(row[1])) for row in self._db.execute(query, ACTIVE)]

    def using(self, client: str, file_id: str) -> list[str]:
        """Ids of this client's batches with work left that read ``file_id``."""
        return [
            batch["id"] for owner, batch in self.active() if owner == client and batch.get("input_file_id") == file_id
        ]

    def _run(self, sql: str, args: tuple[Any, ...]) -> sqlite3.Cursor:
        try:
            return self._db.execute(sql, args)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot write the batch state {self.path}: {exc}") from None
