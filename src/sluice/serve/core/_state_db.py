"""How the server's own small SQLite files are opened: autocommit, WAL with
``synchronous=NORMAL`` (a killed process loses nothing committed), a busy timeout."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from ..._errors import StoreError

__all__ = ["open_state_db"]


def open_state_db(path: Path, schema: str, what: str) -> sqlite3.Connection:
    """``path`` opened (its directory made) with ``schema`` applied; a StoreError naming
    ``what`` ("the batch state") when it cannot be."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute("PRAGMA busy_timeout=5000")
        db.executescript(schema)
    except (sqlite3.Error, OSError) as exc:
        raise StoreError(f"cannot open {what} {path}: {exc}") from None
    return db
