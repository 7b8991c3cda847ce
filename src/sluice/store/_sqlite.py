"""The embedded default store: one SQLite file in WAL mode.

Every result is committed as it lands (one small transaction: a kill -9 loses
nothing that was answered). ``synchronous=NORMAL`` in WAL mode survives a crash of
the process, which is what a rerun needs; only a power cut may lose the last commits.
Readers (``sluice report``) can open the file while a job is writing it.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import _json
from .._errors import ConfigError
from .._models import Result
from .._records import result_record

__all__ = ["SqliteStore", "StoredResult"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS results (
    key TEXT PRIMARY KEY,
    ok INTEGER NOT NULL,
    error_type TEXT,
    input_tokens INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0,
    cost_usd REAL,
    attempts INTEGER NOT NULL DEFAULT 0,
    latency_s REAL NOT NULL DEFAULT 0,
    record TEXT NOT NULL,
    finished_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


@dataclass(frozen=True, slots=True)
class StoredResult:
    ok: bool
    record: Mapping[str, Any]


class SqliteStore:
    """A :class:`~sluice.store.Store` in one SQLite file (created if missing)."""

    def __init__(self, path: str | Path, *, readonly: bool = False) -> None:
        self.path = Path(path)
        try:
            if readonly:
                uri = f"file:{self.path.resolve()}?mode=ro"
                self._db = sqlite3.connect(uri, uri=True, isolation_level=None)
            else:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._db = sqlite3.connect(self.path, isolation_level=None)
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA synchronous=NORMAL")
                self._db.executescript(_SCHEMA)
            self._db.execute("PRAGMA busy_timeout=5000")
            self._db.execute("SELECT count(*) FROM results").fetchone()
        except sqlite3.DatabaseError as exc:
            raise ConfigError(f"{self.path}: not a usable sluice state file ({exc})") from None

    # -- the Store protocol -----------------------------------------------------------

    def get(self, key: str) -> StoredResult | None:
        row = self._db.execute("SELECT ok, record FROM results WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        return StoredResult(bool(row[0]), _json.loads(row[1]))

    def put(self, key: str, result: Result) -> None:
        record = result_record(result)
        self._db.execute(
            "INSERT OR REPLACE INTO results (key, ok, error_type, input_tokens, output_tokens,"
            " cost_usd, attempts, latency_s, record, finished_at) VALUES (?,?,?,?,?,?,?,?,?,?)",
            (
                key,
                int(result.ok),
                result.error.kind if result.error is not None else None,
                result.usage.input_tokens,
                result.usage.output_tokens,
                result.cost_usd,
                result.attempts,
                result.timings.latency,
                _json.dumps_text(record),
                time.time(),
            ),
        )  # autocommit: committed when execute returns

    def close(self) -> None:
        self._db.close()

    # -- job bookkeeping and reports -----------------------------------------------------

    def set_meta(self, **values: Any) -> None:
        with self._db:
            self._db.execute("BEGIN")
            self._db.executemany(
                "INSERT OR REPLACE INTO meta (name, value) VALUES (?, ?)",
                [(k, json.dumps(v)) for k, v in values.items()],
            )

    def meta(self) -> dict[str, Any]:
        return {name: json.loads(value) for name, value in self._db.execute("SELECT name, value FROM meta")}

    def summary(self) -> dict[str, Any]:
        """Counts, tokens, cost and attempts over every stored result."""
        row = self._db.execute(
            "SELECT count(*), coalesce(sum(ok),0), coalesce(sum(input_tokens),0),"
            " coalesce(sum(output_tokens),0), sum(cost_usd), coalesce(sum(attempts),0),"
            " min(finished_at), max(finished_at) FROM results"
        ).fetchone()
        errors = dict(
            self._db.execute(
                "SELECT error_type, count(*) FROM results WHERE ok = 0 GROUP BY error_type ORDER BY 2 DESC"
            ).fetchall()
        )
        return {
            "results": row[0],
            "succeeded": row[1],
            "failed": row[0] - row[1],
            "input_tokens": row[2],
            "output_tokens": row[3],
            "cost_usd": row[4],
            "attempts": row[5],
            "first_finished_at": row[6],
            "last_finished_at": row[7],
            "errors": errors,
        }

    def latencies(self) -> Iterator[float]:
        for (latency,) in self._db.execute("SELECT latency_s FROM results WHERE ok = 1"):
            yield latency

    def __repr__(self) -> str:
        return f"<SqliteStore {self.path}>"
