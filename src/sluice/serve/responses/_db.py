"""Stored Responses (``store`` true, OpenAI's default): what ``previous_response_id`` and
``GET /v1/responses/{id}`` read, in one SQLite file under the state dir.

A row is one response: the Response object as the client got it, and its turn of the
conversation (the input items it was asked with and the items it answered), with the id
of the response it continued. A conversation is read back by walking those links, so a
long one is stored once, not once per turn. Rows belong to a client: one client never
reads another's (an id it does not own is not found, as at OpenAI).

Nothing is kept for ever: a response older than its time to live (``[serve]
responses_ttl_days``, 30 by default, as at OpenAI) is not found, and is deleted by the next
write after it expired; a client's responses are kept within ``responses_mb_per_client``
(their JSON's bytes), its oldest deleted first to make room for a new one, and one larger
than that alone is not kept at all. A conversation continued past a turn that is gone
starts at the first turn still kept.

Calls are synchronous ``sqlite3`` under a lock; the handlers run them in a thread
(``asyncio.to_thread``) since a turn may hold images. WAL with ``synchronous=NORMAL``,
like the rest of the state.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from aiohttp import web

from ..._errors import StoreError
from ..core._state_db import open_state_db

__all__ = ["MAX_TURNS", "RESPONSES_DB", "ResponsesDB"]

#: The longest conversation followed back through ``previous_response_id``.
MAX_TURNS = 10_000
#: Seconds between two sweeps of the expired responses (each write may sweep).
_SWEEP_EVERY = 60.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    client TEXT NOT NULL,
    previous TEXT,
    created_at REAL NOT NULL,
    response TEXT NOT NULL,
    turn TEXT NOT NULL
);
"""
#: Each row's bytes (for the per-client cap), and the indexes its sweeps use; added to a
#: file made before them (its rows' sizes counted once).
_SIZES = """
ALTER TABLE responses ADD COLUMN size INTEGER NOT NULL DEFAULT 0;
UPDATE responses SET size = length(CAST(response AS BLOB)) + length(CAST(turn AS BLOB));
"""
_INDEXES = """
CREATE INDEX IF NOT EXISTS responses_by_client ON responses (client, created_at);
CREATE INDEX IF NOT EXISTS responses_by_age ON responses (created_at);
"""


class ResponsesDB:
    """Stored responses, by client, each kept ``ttl_s`` seconds and a client's within
    ``max_bytes`` (see the module docstring)."""

    def __init__(
        self,
        path: Path,
        *,
        ttl_s: float = 30 * 86400.0,
        max_bytes: int = 256 * 1024 * 1024,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = path
        self.ttl_s = ttl_s
        self.max_bytes = max_bytes
        #: What time it is (tests give a clock of their own).
        self.clock = clock
        self._swept = -float("inf")
        self._lock = threading.Lock()
        self._db = open_state_db(path, _SCHEMA, "the stored responses")
        try:
            columns = {row[1] for row in self._db.execute("PRAGMA table_info(responses)")}
            if "size" not in columns:
                self._db.executescript(_SIZES)
            self._db.executescript(_INDEXES)
        except sqlite3.Error as exc:
            self._db.close()
            raise StoreError(f"cannot open the stored responses {path}: {exc}") from None

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def put(
        self,
        client: str,
        response: Mapping[str, Any],
        asked: Sequence[Mapping[str, Any]],
        answered: Sequence[Mapping[str, Any]],
        previous: str | None,
    ) -> bool:
        """Keep a response and its turn: the input items it was asked (without the earlier
        turns), the items it answered; the client's oldest go to make room. False: it is
        larger than a client may keep, and is not kept."""
        turn = json.dumps({"input": list(asked), "output": list(answered)})
        body = json.dumps(response)
        size = len(body.encode()) + len(turn.encode())
        if size > self.max_bytes:
            return False
        now = self.clock()
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    self._db.execute(
                        "INSERT OR REPLACE INTO responses (id, client, previous, created_at, response, turn, size) "
                        "VALUES (?,?,?,?,?,?,?)",
                        (str(response["id"]), client, previous, now, body, turn, size),
                    )
                    self._make_room(client, str(response["id"]))
                    if now - self._swept >= _SWEEP_EVERY:
                        self._db.execute("DELETE FROM responses WHERE created_at < ?", (now - self.ttl_s,))
                        self._swept = now
                    self._db.execute("COMMIT")
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
            except sqlite3.Error as exc:
                raise StoreError(f"cannot write the stored responses {self.path}: {exc}") from None
        return True

    def _make_room(self, client: str, kept: str) -> None:
        """Delete the client's oldest responses (never ``kept``) until it is within its bytes."""
        (total,) = self._db.execute(
            "SELECT COALESCE(SUM(size), 0) FROM responses WHERE client = ?", (client,)
        ).fetchone()
        if total <= self.max_bytes:
            return
        oldest = self._db.execute(
            "SELECT id, size FROM responses WHERE client = ? AND id != ? ORDER BY created_at, rowid", (client, kept)
        )
        doomed: list[tuple[str]] = []
        for response_id, size in oldest:
            if total <= self.max_bytes:
                break
            doomed.append((response_id,))
            total -= size
        oldest.close()
        self._db.executemany("DELETE FROM responses WHERE id = ?", doomed)

    def response(self, client: str, response_id: str) -> dict[str, Any] | None:
        row = self._one(
            "SELECT response FROM responses WHERE client = ? AND id = ? AND created_at >= ?",
            self._live(client, response_id),
        )
        return json.loads(row[0]) if row is not None else None

    def conversation(self, client: str, response_id: str) -> list[dict[str, Any]] | None:
        """Every item of the conversation up to and including ``response_id``'s answer, oldest
        first; None when the client has no such response. A turn whose predecessor was
        deleted starts the conversation (as OpenAI's does not promise more)."""
        turns: list[list[dict[str, Any]]] = []
        current: str | None = response_id
        while current is not None and len(turns) < MAX_TURNS:
            row = self._one(
                "SELECT previous, turn FROM responses WHERE client = ? AND id = ? AND created_at >= ?",
                self._live(client, current),
            )
            if row is None:
                if not turns:
                    return None
                break
            turn = json.loads(row[1])
            turns.append([*turn["input"], *turn["output"]])
            current = row[0]
        return [item for turn in reversed(turns) for item in turn]

    def input_items(self, client: str, response_id: str) -> list[dict[str, Any]] | None:
        """The input items a response was asked with (its own turn's), or None."""
        row = self._one(
            "SELECT turn FROM responses WHERE client = ? AND id = ? AND created_at >= ?",
            self._live(client, response_id),
        )
        return list(json.loads(row[0])["input"]) if row is not None else None

    def delete(self, client: str, response_id: str) -> bool:
        cursor = self._run("DELETE FROM responses WHERE client = ? AND id = ?", (client, response_id))
        return cursor.rowcount > 0

    def _live(self, client: str, response_id: str) -> tuple[str, str, float]:
        """A read's arguments: the client, the id, and the oldest time still kept."""
        return client, response_id, self.clock() - self.ttl_s

    def _one(self, sql: str, args: tuple[Any, ...]) -> Any:
        with self._lock:
            try:
                return self._db.execute(sql, args).fetchone()
            except sqlite3.Error as exc:
                raise StoreError(f"cannot read the stored responses {self.path}: {exc}") from None

    def _run(self, sql: str, args: tuple[Any, ...]) -> sqlite3.Cursor:
        with self._lock:
            try:
                return self._db.execute(sql, args)
            except sqlite3.Error as exc:
                raise StoreError(f"cannot write the stored responses {self.path}: {exc}") from None


#: ``app[RESPONSES_DB]``: the stored responses.
RESPONSES_DB: web.AppKey[ResponsesDB] = web.AppKey("sluice.serve.responses", ResponsesDB)
