"""Stored Responses (``store`` true, OpenAI's default): what ``previous_response_id`` and
``GET /v1/responses/{id}`` read, in one SQLite file under the state dir.

A row is one response: the Response object as the client got it, and its turn of the
conversation (the input items it was asked with and the items it answered), with the id
of the response it continued. A conversation is read back by walking those links, so a
long one is stored once, not once per turn. Rows belong to a client: one client never
reads another's (an id it does not own is not found, as at OpenAI).

Calls are synchronous ``sqlite3`` under a lock; the handlers run them in a thread
(``asyncio.to_thread``) since a turn may hold images. WAL with ``synchronous=NORMAL``,
like the rest of the state.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from aiohttp import web

from .._errors import StoreError
from ._state_db import open_state_db

__all__ = ["MAX_TURNS", "RESPONSES_DB", "ResponsesDB"]

#: The longest conversation followed back through ``previous_response_id``.
MAX_TURNS = 10_000

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


class ResponsesDB:
    """Stored responses, by client."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._db = open_state_db(path, _SCHEMA, "the stored responses")

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
    ) -> None:
        """Keep a response and its turn: the input items it was asked (without the earlier
        turns), the items it answered."""
        turn = {"input": list(asked), "output": list(answered)}
        row = (str(response["id"]), client, previous, time.time(), json.dumps(response), json.dumps(turn))
        self._run(
            "INSERT OR REPLACE INTO responses (id, client, previous, created_at, response, turn) VALUES (?,?,?,?,?,?)",
            row,
        )

    def response(self, client: str, response_id: str) -> dict[str, Any] | None:
        row = self._one("SELECT response FROM responses WHERE client = ? AND id = ?", (client, response_id))
        return json.loads(row[0]) if row is not None else None

    def conversation(self, client: str, response_id: str) -> list[dict[str, Any]] | None:
        """Every item of the conversation up to and including ``response_id``'s answer, oldest
        first; None when the client has no such response. A turn whose predecessor was
        deleted starts the conversation (as OpenAI's does not promise more)."""
        turns: list[list[dict[str, Any]]] = []
        current: str | None = response_id
        while current is not None and len(turns) < MAX_TURNS:
            row = self._one("SELECT previous, turn FROM responses WHERE client = ? AND id = ?", (client, current))
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
        row = self._one("SELECT turn FROM responses WHERE client = ? AND id = ?", (client, response_id))
        return list(json.loads(row[0])["input"]) if row is not None else None

    def delete(self, client: str, response_id: str) -> bool:
        cursor = self._run("DELETE FROM responses WHERE client = ? AND id = ?", (client, response_id))
        return cursor.rowcount > 0

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
