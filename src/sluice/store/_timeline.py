"""A job's timeline in its state file: every attempt, cooldown and limit, for ``sluice report``.

The report plots what happened over time (requests and tokens against the limits, in
flight, latency, 429s, retries, failures, money, cooldowns), which the results table
cannot tell: it holds one row per request, its last attempt's latency, no 429 that was
retried, no cooldown. So an engine whose store keeps a timeline (``SqliteStore(...,
timeline=True)``; a batch job's does) tells it about each attempt as it settles and each
cooldown as it begins (:class:`~sluice.store.AttemptLog`).

Cheap on the hot path: an attempt costs one tuple appended to a list on the event loop.
Rows go to the store's writer thread in batches (at 1,024 attempts or a second after the
first buffered one, and when the store closes), queued behind the job's own writes
without anyone waiting on them. There a batch becomes *one* row of columns (each a packed
little-endian array: ``array`` from the standard library): a row per attempt cost ~5 µs
of SQLite work each (a tenth of a batch job's CPU per request, measured), a column
chunk ~1 µs, and ~55 bytes of file. A crash loses at most the last second of the
timeline, never an answer (the timeline is a report's, not the job's, record).

Tables (``timeline_*``; a state file from before them has none and reports from its
results): ``deployments`` (id, label, model, tier, provider), ``attempt_chunks`` (per
attempt: wall-clock start, seconds, deployment, the job's attempt number, outcome — 0
for an answer, else 1 + its kind's place in the chunk's ``kinds`` — HTTP status, tokens,
dollars charged, time to first token of a stream or NaN),
``cooldowns`` (deployment, start, end, why), ``limits`` (deployment's requests and
tokens per minute and in-flight cap: configured at a run's start, then as learnt from
the provider's headers) and ``runs`` (start, pid, concurrency, budget).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import sqlite3
import sys
import time
from array import array
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .._errors import SluiceError
    from .._models import Deployment, Usage
    from ._writer import Writer

__all__ = ["TIMELINE_SCHEMA", "Limits", "SqliteTimeline", "has_timeline", "report_rows"]

TIMELINE_SCHEMA = """
CREATE TABLE IF NOT EXISTS timeline_deployments (
    id INTEGER PRIMARY KEY,
    label TEXT NOT NULL UNIQUE,
    model TEXT NOT NULL,
    tier TEXT,
    provider TEXT
);
CREATE TABLE IF NOT EXISTS timeline_attempt_chunks (
    attempts INTEGER NOT NULL,
    kinds TEXT NOT NULL,
    started BLOB NOT NULL,
    seconds BLOB NOT NULL,
    deployment BLOB NOT NULL,
    attempt BLOB NOT NULL,
    outcome BLOB NOT NULL,
    status BLOB NOT NULL,
    input_tokens BLOB NOT NULL,
    output_tokens BLOB NOT NULL,
    cost_usd BLOB NOT NULL,
    ttft BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS timeline_cooldowns (
    deployment INTEGER NOT NULL,
    started REAL NOT NULL,
    ended REAL NOT NULL,
    why TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS timeline_limits (
    at REAL NOT NULL,
    deployment INTEGER NOT NULL,
    rpm REAL,
    tpm REAL,
    max_in_flight INTEGER,
    learnt INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS timeline_runs (
    started REAL NOT NULL,
    pid INTEGER,
    concurrency INTEGER,
    budget_usd REAL
);
"""

#: A deployment's limits in per-minute terms: (requests, tokens, in flight); None: none.
Limits = tuple[float | None, float | None, int | None]

#: Attempts buffered before they go to the writer, and seconds the oldest may wait.
_BATCH = 1024
_LINGER = 1.0


class SqliteTimeline:
    """An :class:`~sluice.store.AttemptLog` writing a state file's ``timeline_*`` tables."""

    __slots__ = ("_attempts", "_cooldowns", "_flush_at", "_ids", "_limits", "_next_id", "_offset", "_writer")

    def __init__(self, writer: Writer) -> None:
        self._writer = writer
        self._attempts: list[tuple[Any, ...]] = []
        self._cooldowns: list[tuple[Deployment, float, float, str]] = []
        self._limits: dict[str, Limits] = {}
        self._flush_at = float("inf")
        #: The loop's clock to the wall clock (the loop's is monotonic): set at the first event.
        self._offset: float | None = None
        ids, self._next_id = writer.run_sync(_open_op)
        #: Deployment label -> row id (those of earlier runs of the job, then this run's).
        self._ids: dict[str, int] = ids

    # -- what the engine tells it (the AttemptLog protocol) ---------------------------

    def attempt(
        self,
        deployment: Deployment,
        sent_at: float,
        ended: float,
        number: int,
        error: SluiceError | None,
        usage: Usage | None,
        cost: float,
        first_at: float | None,
    ) -> None:
        """An attempt settled (the loop's clock: sent, ended, its first streamed delta)."""
        attempts = self._attempts
        if not attempts:
            if self._offset is None:
                self._offset = time.time() - asyncio.get_running_loop().time()
            self._flush_at = ended + _LINGER
        # Only what the row needs: an error's kind and status, not the error (and its traceback).
        failure = None if error is None else (error.kind, getattr(error, "status", None))
        tokens = None if usage is None else (usage.input_tokens, usage.output_tokens)
        attempts.append((deployment, sent_at, ended, number, failure, tokens, cost, first_at))
        if len(attempts) >= _BATCH or ended >= self._flush_at:
            self.flush()

    def cooldown(self, deployment: Deployment, seconds: float, why: str) -> None:
        """The deployment takes no attempt for ``seconds`` from now, for the reason ``why``."""
        now = asyncio.get_running_loop().time()
        if self._offset is None:
            self._offset = time.time() - now
        self._cooldowns.append((deployment, now, now + seconds, why))

    # -- what the job tells it ------------------------------------------------------------

    def run_started(self, *, concurrency: int | None, budget_usd: float | None) -> None:
        """A run of the job begins (its engine's concurrency and budget); durable on return."""
        row = (time.time(), os.getpid(), concurrency, budget_usd)
        self._writer.run_sync(lambda db: db.execute("INSERT INTO timeline_runs VALUES (?,?,?,?)", row))

    def limits(self, deployment: Deployment, limits: Limits, *, learnt: bool) -> None:
        """The deployment's limits now (per minute); written only when they changed."""
        label = deployment.label
        if self._limits.get(label) == limits:
            return
        self._limits[label] = limits
        new = self._new_deployments([deployment])
        row = (time.time(), self._id(deployment), *limits, int(learnt))
        self._writer.submit(lambda db: _limits_op(db, new, row))

    def flush(self) -> None:
        """Hand what is buffered to the writer (committed with its next batch)."""
        attempts, self._attempts = self._attempts, []
        cooldowns, self._cooldowns = self._cooldowns, []
        self._flush_at = float("inf")
        if not attempts and not cooldowns:
            return
        offset = self._offset or 0.0
        new = self._new_deployments([row[0] for row in attempts] + [row[0] for row in cooldowns])
        ids = self._ids
        self._writer.submit(lambda db: _flush_op(db, new, ids, offset, attempts, cooldowns))

    # -- internals -------------------------------------------------------------------------

    def _id(self, deployment: Deployment) -> int:
        label = deployment.label
        found = self._ids.get(label)
        if found is None:
            found = self._ids[label] = self._next_id
            self._next_id += 1
        return found

    def _new_deployments(self, deployments: list[Deployment]) -> list[tuple[Any, ...]]:
        """Rows for the deployments not yet in the table (ids given now, on this thread)."""
        rows = []
        for deployment in {d.label: d for d in deployments}.values():
            if deployment.label not in self._ids:
                rows.append(
                    (self._id(deployment), deployment.label, deployment.model, deployment.tier, _provider(deployment))
                )
        return rows

    def __repr__(self) -> str:
        return f"<SqliteTimeline {len(self._ids)} deployments, {len(self._attempts)} attempts buffered>"


def _provider(deployment: Deployment) -> str | None:
    try:
        return deployment.provider_name
    except Exception:  # an odd model name: the report shows none
        return None


def _open_op(db: sqlite3.Connection) -> tuple[dict[str, int], int]:
    for statement in TIMELINE_SCHEMA.split(";"):  # not executescript(): it would commit the writer's transaction
        if statement.strip():
            db.execute(statement)
    rows = db.execute("SELECT label, id FROM timeline_deployments").fetchall()
    ids = {str(label): int(deployment_id) for label, deployment_id in rows}
    return ids, max(ids.values(), default=0) + 1


def _limits_op(db: sqlite3.Connection, new: list[tuple[Any, ...]], row: tuple[Any, ...]) -> None:
    db.executemany("INSERT OR IGNORE INTO timeline_deployments VALUES (?,?,?,?,?)", new)
    db.execute("INSERT INTO timeline_limits VALUES (?,?,?,?,?,?)", row)


def _flush_op(
    db: sqlite3.Connection,
    new: list[tuple[Any, ...]],
    ids: dict[str, int],
    offset: float,
    attempts: list[tuple[Any, ...]],
    cooldowns: list[tuple[Deployment, float, float, str]],
) -> None:
    """The buffered rows made into columns (here, on the writer's thread) and inserted."""
    db.executemany("INSERT OR IGNORE INTO timeline_deployments VALUES (?,?,?,?,?)", new)
    if attempts:
        db.execute(
            "INSERT INTO timeline_attempt_chunks VALUES (?,?,?,?,?,?,?,?,?,?,?,?)", _chunk(ids, offset, attempts)
        )
    db.executemany(
        "INSERT INTO timeline_cooldowns VALUES (?,?,?,?)",
        [(ids[d.label], start + offset, end + offset, why) for d, start, end, why in cooldowns],
    )


#: The columns of an attempt chunk and their array type codes (``I`` is 4 bytes on every
#: platform CPython supports; checked below).
_COLUMNS = (
    ("started", "d"),
    ("seconds", "f"),
    ("deployment", "H"),
    ("attempt", "H"),
    ("outcome", "B"),
    ("status", "H"),
    ("input_tokens", "I"),
    ("output_tokens", "I"),
    ("cost_usd", "d"),
    ("ttft", "f"),
)
assert array("I").itemsize == 4
assert array("H").itemsize == 2
_SWAP = sys.byteorder != "little"  # stored little-endian whatever the machine


def _chunk(ids: dict[str, int], offset: float, attempts: list[tuple[Any, ...]]) -> tuple[Any, ...]:
    """Attempts as one row of packed columns (see ``_COLUMNS``)."""
    kinds: dict[str, int] = {}
    try:
        columns = _columns(ids, offset, attempts, kinds, careful=False)
    except (OverflowError, TypeError, ValueError):  # a figure out of range (a provider's odd usage)
        kinds.clear()
        columns = _columns(ids, offset, attempts, kinds, careful=True)
    if _SWAP:
        for column in columns:
            column.byteswap()
    return (len(attempts), json.dumps(list(kinds)), *(column.tobytes() for column in columns))


def _columns(
    ids: dict[str, int], offset: float, attempts: list[tuple[Any, ...]], kinds: dict[str, int], *, careful: bool
) -> list[array[Any]]:
    columns: list[array[Any]] = [array(code) for _, code in _COLUMNS]
    started, seconds, deployment, attempt, outcome, status, tokens_in, tokens_out, cost, ttft = columns
    nan = math.nan
    for dep, sent_at, ended, number, failure, tokens, charged, first_at in attempts:
        started.append(sent_at + offset)
        seconds.append(ended - sent_at)
        deployment.append(ids[dep.label])
        ttft.append(nan if first_at is None else first_at - sent_at)
        cost.append(charged)
        if failure is None:
            outcome.append(0)
            status.append(0)
        else:
            kind, code = failure
            outcome.append(kinds.setdefault(kind, len(kinds) + 1) if len(kinds) < 254 else 255)
            status.append(code if isinstance(code, int) and 0 < code < 0xFFFF else 0)
        if tokens is None:
            tokens_in.append(0)
            tokens_out.append(0)
        elif careful:
            tokens_in.append(_fits(tokens[0], 0xFFFFFFFF))
            tokens_out.append(_fits(tokens[1], 0xFFFFFFFF))
        else:
            tokens_in.append(tokens[0])
            tokens_out.append(tokens[1])
        attempt.append(_fits(number, 0xFFFF) if careful else number)
    return columns


def _fits(value: object, top: int) -> int:
    return min(max(value, 0), top) if isinstance(value, int) else 0


def _unchunk(row: tuple[Any, ...]) -> Iterator[tuple[Any, ...]]:
    """A chunk's attempts as rows: (started, seconds, deployment id, attempt number,
    outcome kind or None, status or None, input tokens, output tokens, dollars, ttft or None)."""
    kinds = [None, *json.loads(row[1])]
    columns = []
    for (_, code), blob in zip(_COLUMNS, row[2:], strict=True):
        column = array(code)
        column.frombytes(blob)
        if _SWAP:
            column.byteswap()
        columns.append(column)
    for started, seconds, dep, number, outcome, status, tokens_in, tokens_out, cost, ttft in zip(*columns, strict=True):
        kind = kinds[outcome] if outcome < len(kinds) else "error"
        yield (
            started,
            seconds,
            dep,
            number,
            kind,
            status or None,
            tokens_in,
            tokens_out,
            cost,
            None if ttft != ttft else ttft,
        )


def has_timeline(db: sqlite3.Connection) -> bool:
    """Whether the state file has the timeline tables (a file from before them has not)."""
    found = db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'timeline_attempt_chunks'")
    return found.fetchone() is not None


_FROM_RECORD = "json_extract(record, '$.deployment'), json_extract(record, '$.model'), json_extract(record, '$.tier')"

#: What ``sluice report`` reads: the timeline's tables (all but ``attempts`` in time order),
#: and the results as one attempt each (a state file from before the timeline), its
#: slowest and its failures.
_QUERIES = {
    "deployments": "SELECT id, label, model, tier, provider FROM timeline_deployments ORDER BY id",
    "attempts": "SELECT * FROM timeline_attempt_chunks",  # unordered: a report's buckets need no order
    "cooldowns": "SELECT deployment, started, ended, why FROM timeline_cooldowns ORDER BY started",
    "limits": "SELECT at, deployment, rpm, tpm, max_in_flight, learnt FROM timeline_limits ORDER BY at",
    "runs": "SELECT started, pid, concurrency, budget_usd FROM timeline_runs ORDER BY started",
    "results": f"SELECT finished_at - latency_s, latency_s, {_FROM_RECORD}, attempts, ok, error_type,"
    " json_extract(record, '$.error.status'), input_tokens, output_tokens, coalesce(cost_usd, 0) FROM results",
    "slowest": f"SELECT key, latency_s, attempts, {_FROM_RECORD}, ok, error_type, json_extract(record,"
    " '$.error.message') FROM results ORDER BY latency_s DESC LIMIT ?",
    "failed": f"SELECT key, latency_s, attempts, {_FROM_RECORD}, ok, error_type, json_extract(record,"
    " '$.error.message') FROM results WHERE ok = 0 ORDER BY finished_at LIMIT ?",
}


def report_rows(db: sqlite3.Connection, name: str, limit: int = -1) -> Iterator[tuple[Any, ...]]:
    """The rows of one of :data:`_QUERIES` (``limit``: for ``slowest`` and ``failed``)."""
    query = _QUERIES[name]
    if name == "attempts":
        for chunk in db.execute(query):
            yield from _unchunk(chunk)
        return
    yield from db.execute(query, (limit,)) if "?" in query else db.execute(query)
