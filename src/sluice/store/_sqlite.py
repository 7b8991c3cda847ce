"""The embedded default store: one SQLite file in WAL mode.

What it holds, and why:

* ``results``: the finished outcome of each request key, so a rerun serves answers
  instead of paying for them again;
* ``intents``: one row per attempt *on its way to the provider*, written (and committed)
  before the request is sent and removed when the attempt is settled. Rows left over
  after a crash are exactly the requests that were in flight: the rerun counts their
  worst case as possibly billed and says how many may be paid twice;
* ``charges``: money by key, answers and possibly-billed failures apart, a row per
  charge (one row per key in older files, which keep that), only ever added
  to, so no rerun (``--retry-failed`` included) can erase what was spent;
* ``meta``: the job's bookkeeping (input, output, status...).

``results`` is looked up by key through a unique index. A batch job's first run (an
exclusive store, empty when opened) appends its results without that index and builds it
once, when it closes: kept up to date row by row, an index on random hash keys dirtied a
page of its own per result and roughly doubled what the state file wrote. Until then a
Bloom filter of the keys put says "not here" for every other key; the first key it is
unsure of (a duplicate line) builds the index there and then. A run that crashed leaves
the index to the next open, which builds it before anything else.

Writes go through a :class:`~sluice.store._writer.Writer` thread with group commit;
``synchronous=NORMAL`` in WAL mode survives a crash of the process (only a power cut may
lose the last commits). Reads happen on the caller's thread through a second connection,
and ``sluice report`` can open the file while a job is writing it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import _json
from .._errors import ConfigError, StoreError
from .._models import Result
from .._records import result_record
from . import _batches
from ._at_rest import at_rest
from ._groups import spend_by_group_op
from ._key_filter import KeyFilter
from ._timeline import SqliteTimeline, has_timeline, report_rows
from ._vectors import StoredVector, get_vectors, put_vectors_op
from ._writer import Writer, describe_sqlite_error

__all__ = ["Recovered", "Spend", "SqliteStore", "StoredResult"]

#: 3: results and charges appended, the key index built apart (older layouts still read
#: and written as they are); a file from a newer sluice is refused, not misused.
SCHEMA_VERSION = 3

_SCHEMA = """
CREATE TABLE IF NOT EXISTS results (
    key TEXT NOT NULL,
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
CREATE TABLE IF NOT EXISTS intents (
    id INTEGER PRIMARY KEY,
    key TEXT NOT NULL,
    worst_usd REAL NOT NULL,
    started_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS charges (
    key TEXT NOT NULL,
    answered_usd REAL NOT NULL DEFAULT 0,
    maybe_billed_usd REAL NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
"""

_PUT = (
    "INSERT OR REPLACE INTO results (key, ok, error_type, input_tokens, output_tokens,"
    " cost_usd, attempts, latency_s, record, finished_at) VALUES (?,?,?,?,?,?,?,?,?,?)"
)
#: A charge, appended (an upsert on random keys dirtied a page of the file per charge).
_CHARGE = "INSERT INTO charges (key, answered_usd, maybe_billed_usd) VALUES (?, ?, ?)"
#: A charge into a file whose charges are keyed (one row per key, from before).
_CHARGE_KEYED = _CHARGE + (
    " ON CONFLICT(key) DO UPDATE SET answered_usd = answered_usd + excluded.answered_usd,"
    " maybe_billed_usd = maybe_billed_usd + excluded.maybe_billed_usd"
)


@dataclass(frozen=True, slots=True)
class StoredResult:
    ok: bool
    record: Mapping[str, Any]
    #: A failure a rerun keeps (the provider rejected the request itself).
    kept: bool = False


@dataclass(frozen=True, slots=True)
class Spend:
    """Dollars a job has cost so far, by what is known about them."""

    #: Answers, at their reported usage.
    answered: float = 0.0
    #: Failed attempts the provider may have billed (timeouts, resets, garbled 200s,
    #: requests in flight when a run stopped), at their worst case.
    maybe_billed: float = 0.0
    #: Attempts in flight right now (a running job), at their worst case.
    in_flight: float = 0.0

    @property
    def total(self) -> float:
        return self.answered + self.maybe_billed + self.in_flight


@dataclass(frozen=True, slots=True)
class Recovered:
    """Attempts that were in flight when an earlier run stopped without settling them."""

    requests: int = 0
    worst_usd: float = 0.0
    #: Of those, lines of provider batches the rerun follows (not counted as maybe billed).
    in_batches: int = 0


class SqliteStore:
    """A :class:`~sluice.store.Store` in one SQLite file (created if missing)."""

    def __init__(
        self,
        path: str | Path,
        *,
        readonly: bool = False,
        exclusive: bool = False,
        expected_keys: int | None = None,
        timeline: bool = False,
        on_full: Callable[[], bool] | None = None,
    ) -> None:
        """``exclusive``: this store is the only writer of the file while it is open (a batch
        job holds a lock on it), so lookups of keys it never stored can skip the query.
        ``expected_keys``: about how many results it will hold (a job's record count), to
        size what tracks the keys of a first run; a wrong guess costs speed, not answers.
        ``timeline``: keep every attempt, cooldown and limit for ``sluice report`` (see
        :mod:`._timeline`); an engine on this store then tells :attr:`timeline` of them.
        ``on_full``: asked when a write finds the disk full; True when it made room (the
        write is tried once more)."""
        self.path = Path(path)
        self._writer: Writer | None = None
        #: Where an engine on this store logs its attempts (None: not kept).
        self.timeline: SqliteTimeline | None = None
        self._fresh: KeyFilter | None = None
        self._indexed = True
        self._charge = _CHARGE
        self._next_intent = 1
        self._batch_tables = False  # the provider-batch journal's tables exist (see line_state)
        self._chunk_states: dict[int, _batches.Chunk] | None = None  # read once, then kept here
        try:
            if readonly:
                uri = f"file:{self.path.resolve()}?mode=ro{'&immutable=1' if at_rest(self.path) else ''}"
                self._db = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
            else:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._writer = Writer(self.path, _setup, on_full)
                self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA busy_timeout=5000")
            _check_integrity(self._db, self.path)
            empty = self._db.execute("SELECT NOT EXISTS (SELECT 1 FROM results)").fetchone()[0]
            #: For a state with no results when opened, the keys put since (a lookup of any
            #: other key needs no query: a first run asks for each request once).
            self._fresh = KeyFilter(expected_keys) if empty and exclusive and not readonly else None
            #: Likewise for the provider-batch journal, when it had no chunks: the custom ids
            #: chunked since (a line never chunked needs no query in ``line_state``).
            journal_empty = not _batches.has_tables_op(self._db)
            self._fresh_lines = KeyFilter(expected_keys) if journal_empty and exclusive and not readonly else None
            #: How a charge is written: appended, or added to its key's row in an older file.
            self._charge = _CHARGE_KEYED if _has_index(self._db, "sqlite_autoindex_charges_1") else _CHARGE
            #: Whether results has its key index (see the module's docstring).
            keyed = _has_index(self._db, "results_key") or _has_index(self._db, "sqlite_autoindex_results_1")
            self._indexed = readonly or (self._fresh is None and keyed)
            if not self._indexed:  # build it (after a crash), or drop it for a first run: a write
                self._indexed = self._write().run_sync(_key_index_op(keep=self._fresh is None))
            row = self._db.execute("SELECT max(id) FROM intents").fetchone() if not readonly else None
            self._next_intent = (row[0] or 0) + 1 if row else 1
            if timeline and not readonly:
                self.timeline = SqliteTimeline(self._write())
        except sqlite3.DatabaseError as exc:
            self._close_quietly()
            advice = (
                "give the state file of a sluice job"
                if readonly
                else "move it aside and rerun (the output's records are kept with --adopt-output)"
            )
            raise ConfigError(
                f"{self.path} is not a usable sluice state file ({describe_sqlite_error(exc)}); {advice}"
            ) from None
        except OSError as exc:
            self._close_quietly()
            raise StoreError(f"cannot open the state file {self.path}: {exc.strerror or exc}") from None
        except StoreError:  # the key index could not be built or checked: no writer left behind
            self._close_quietly()
            raise

    # -- the Store protocol -----------------------------------------------------------

    def get(self, key: str) -> StoredResult | None:
        if self._fresh is not None and not self._fresh.may_hold(key):
            return None  # a state that had no results when opened, and no such key put since
        with contextlib.suppress(StoreError):  # the writer failed (the job is stopping): this lookup scans
            self._index_keys()
        row = self._db.execute("SELECT ok, record FROM results WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        record = _json.loads(row[1])
        return StoredResult(bool(row[0]), record, kept=not row[0] and _kept(record))

    async def begin(self, key: str, worst_usd: float) -> int:
        """Record that an attempt is about to be sent; returns when that is durable."""
        intent = self._next_intent
        self._next_intent += 1
        row = (intent, key, worst_usd, time.time())
        await self._write().run(lambda db: db.execute("INSERT INTO intents VALUES (?,?,?,?)", row))
        return intent

    def settle(self, intent: int, charged_usd: float, *, answered: bool) -> None:
        """The attempt is over and cost ``charged_usd`` (its answer, or the worst case of a
        failure it may have been billed for). Queued: durable with the next awaited write;
        until then a crash counts the attempt at its worst case, which is safe."""
        charge = (charged_usd, 0.0) if answered else (0.0, charged_usd)
        self._write().submit(_settle_op(intent, charge, self._charge))

    async def put(self, key: str, result: Result) -> None:
        """Record a finished result; returns when it is durable."""
        self._note_key(key)
        row = _result_row(key, result)
        await self._write().run(lambda db: db.execute(_PUT, row))

    async def put_at(self, key: str, result: Result, finished_at: float) -> None:
        """:meth:`put` of a result that finished elsewhere, at ``finished_at`` (Unix seconds):
        a copy for the report (``sluice report --redis --job``)."""
        self._note_key(key)
        row = (*_result_row(key, result)[:-1], finished_at)
        await self._write().run(lambda db: db.execute(_PUT, row))

    async def put_settled(self, key: str, result: Result, intent: int, charged_usd: float, *, answered: bool) -> None:
        """:meth:`put` and the :meth:`settle` of the attempt that ended with ``result``, as one
        write in one transaction (a result costs one op, not two); returns when durable."""
        self._note_key(key)
        row = _result_row(key, result)
        charge = (key, charged_usd, 0.0) if answered else (key, 0.0, charged_usd)
        charge_sql = self._charge

        def op(db: sqlite3.Connection) -> None:
            removed = db.execute("DELETE FROM intents WHERE id = ?", (intent,)).rowcount
            if removed and (charge[1] or charge[2]):
                db.execute(charge_sql, charge)
            db.execute(_PUT, row)

        await self._write().run(op)

    def keys_stored(self, keys: Sequence[str]) -> set[str]:
        """Those of ``keys`` with a stored result (one query per 500; none for a first run's
        keys never put, which its filter rules out)."""
        if self._fresh is not None:
            keys = [key for key in keys if self._fresh.may_hold(key)]
        if not keys:
            return set()
        with contextlib.suppress(StoreError):
            self._index_keys()
        found: set[str] = set()
        for start in range(0, len(keys), 500):
            part = keys[start : start + 500]
            query = f"SELECT key FROM results WHERE key IN ({','.join('?' * len(part))})"
            found.update(key for (key,) in self._db.execute(query, part))
        return found

    async def put_answered(self, rows: Sequence[tuple[Any, ...]], charges: Sequence[tuple[str, float]]) -> None:
        """Answers that were never an attempt of this run (a provider batch's, written back
        at once): their result rows (as :meth:`put` writes them) and what each cost, in one
        transaction; durable on return. The charges go with the results, so a crash leaves
        both or neither: a rerun serves the answer from here and charges nothing again."""
        for row in rows:
            self._note_key(row[0])
        charge_sql = self._charge

        def op(db: sqlite3.Connection) -> None:
            db.executemany(_PUT, rows)
            db.executemany(charge_sql, [(key, usd, 0.0) for key, usd in charges])

        await self._write().run(op)

    def close(self) -> None:
        if self.timeline is not None:
            self.timeline.flush()  # queued before the writer's last commit
        if self._writer is not None:
            if self._writer.error is None:
                with contextlib.suppress(StoreError):  # then the next open builds it
                    self._index_keys()
            self._writer.close()
            self._writer = None
        self._db.close()

    def _note_key(self, key: str) -> None:
        """A result for ``key`` is about to be put: with no index yet, a key that may be
        there already gets the index first (INSERT OR REPLACE needs it to replace)."""
        if self._fresh is not None and self._fresh.add(key):
            self._index_keys()

    def _index_keys(self) -> None:
        """Build the key index now, if results has none yet (blocks until it is built)."""
        if not self._indexed:
            self._indexed = self._write().run_sync(_key_index_op(keep=True))

    # -- embeddings, one row per text (see ._vectors) ------------------------------------

    def get_vectors(self, keys: Sequence[str]) -> dict[str, StoredVector]:
        """The stored outcome of each of ``keys`` that has one (one query per 500 keys)."""
        return get_vectors(self._db, keys)

    async def put_vectors(self, rows: Sequence[tuple[str, StoredVector]]) -> None:
        """Record texts' outcomes in one transaction; returns when it is durable."""
        await self._write().run(put_vectors_op(rows))

    # -- provider batches (see ._batches) -------------------------------------------------

    def batch_job_id(self) -> str:
        """The job's id in its provider batches' metadata (made on first use, kept)."""
        return str(self._write().run_sync(_batches.job_id_op))

    async def new_chunk(self, deployment: str, custom_ids: Sequence[str]) -> int:
        """Record a chunk about to be uploaded; returns its id once durable."""
        if self._fresh_lines is not None:
            for custom_id in custom_ids:
                self._fresh_lines.add(custom_id)
        chunk = int(await self._write().run(_batches.new_chunk_op(deployment, custom_ids)))
        self._chunks()[chunk] = _batches.Chunk(chunk, deployment, (), None, "submitting", time.time())
        return chunk

    async def note_batch(self, chunk: int, batch_id: str | None, status: str) -> None:
        """Record the chunk's batch (or that it has none, or is collected); durable on return."""
        await self._write().run(_batches.note_batch_op(chunk, batch_id, status))
        known = self._chunks().get(chunk)
        if known is not None:
            self._chunks()[chunk] = dataclasses.replace(known, batch_id=batch_id, status=status)

    def _chunks(self) -> dict[int, _batches.Chunk]:
        """The journal's chunks by id (custom ids left out): the only writer keeps it current."""
        if self._chunk_states is None:
            self._chunk_states = _batches.chunk_states_op(self._db)
        return self._chunk_states

    async def save_batch_results(self, chunk: int, batch_id: str, lines: Sequence[tuple[str, bytes]]) -> None:
        """Downloaded result lines by custom id, in one transaction; durable on return."""
        await self._write().run(_batches.save_results_op(chunk, batch_id, lines))

    def open_chunks(self, deployment: str | None = None) -> list[_batches.Chunk]:
        """The chunks of ``deployment`` (None: of every one) an earlier run submitted and did
        not collect."""
        return _batches.chunks_op(self._db, deployment)

    def chunk_counts(self) -> list[tuple[str, str, int, int]]:
        """(deployment, status, batches, lines) of the job's provider batches, for reports."""
        return _batches.chunk_counts_op(self._db)

    def line_state(self, custom_id: str) -> tuple[tuple[str, bytes, int] | None, _batches.Chunk | None]:
        """``custom_id``'s downloaded (batch id, result line, chunk), if any, and the chunk not yet
        collected that holds it, if any (its ``custom_ids`` left empty): one query, or none
        for a line never chunked since a state with no chunks was opened."""
        if self._fresh_lines is not None and not self._fresh_lines.may_hold(custom_id):
            return None, None
        if not self._batch_tables:  # made on the first chunk's write; once there, always there
            self._batch_tables = _batches.has_tables_op(self._db)
            if not self._batch_tables:
                return None, None
        saved, chunk = _batches.line_state_op(self._db, custom_id)
        held = self._chunks().get(chunk) if chunk is not None else None
        return saved, held if held is not None and held.status in ("submitting", "submitted") else None

    def lines_saved(self, custom_ids: Sequence[str]) -> dict[str, tuple[str, bytes, int]]:
        """The downloaded (batch id, result line, chunk) of each of ``custom_ids`` that has one."""
        if self._fresh_lines is not None:
            custom_ids = [c for c in custom_ids if self._fresh_lines.may_hold(c)]
        if not custom_ids or not (self._batch_tables or _batches.has_tables_op(self._db)):
            return {}
        return _batches.saved_lines_op(self._db, custom_ids)

    def chunk_ids(self, chunk: int) -> tuple[str, ...]:
        """The custom ids ``chunk`` was submitted with."""
        return _batches.chunk_ids_op(self._db, chunk)

    @property
    def error(self) -> StoreError | None:
        """Why writing failed, once it has (the store then refuses every write)."""
        return self._writer.error if self._writer is not None else None

    # -- job bookkeeping and reports -----------------------------------------------------

    def set_meta(self, **values: Any) -> None:
        rows = [(k, json.dumps(v)) for k, v in values.items()]
        self._write().run_sync(
            lambda db: db.executemany("INSERT OR REPLACE INTO meta (name, value) VALUES (?, ?)", rows)
        )

    def set_meta_soon(self, **values: Any) -> None:
        """Like :meth:`set_meta`, without waiting for the commit (progress notes mid-job)."""
        rows = [(k, json.dumps(v)) for k, v in values.items()]
        self._write().submit(lambda db: db.executemany("INSERT OR REPLACE INTO meta (name, value) VALUES (?, ?)", rows))

    def meta(self) -> dict[str, Any]:
        try:
            return {name: json.loads(value) for name, value in self._db.execute("SELECT name, value FROM meta")}
        except (ValueError, sqlite3.DatabaseError) as exc:
            raise ConfigError(
                f"{self.path}: the job's notes in this state file are damaged ({exc}); move it aside and rerun"
            ) from None

    def recover_intents(self) -> Recovered:
        """Count attempts an earlier run left in flight as possibly billed (their worst
        case), once: they leave the intents table in the same transaction. An attempt
        that is a line of a provider batch whose id was recorded is not: the rerun follows
        that batch and bills the line once, when it is collected (``in_batches``)."""
        add_up = " ON CONFLICT(key) DO UPDATE SET maybe_billed_usd = maybe_billed_usd + excluded.maybe_billed_usd"
        if self._charge is not _CHARGE_KEYED:
            add_up = ""

        def op(db: sqlite3.Connection) -> Recovered:
            in_batches = _batches.forget_batched_intents_op(db)
            count, worst = db.execute("SELECT count(*), coalesce(sum(worst_usd), 0) FROM intents").fetchone()
            if count:
                db.execute(
                    "INSERT INTO charges (key, maybe_billed_usd) SELECT key, sum(worst_usd) FROM intents WHERE true"
                    " GROUP BY key" + add_up
                )
                db.execute("DELETE FROM intents")
                before = db.execute("SELECT value FROM meta WHERE name = 'in_flight_at_stop'").fetchone()
                total = (json.loads(before[0]) if before else 0) + count
                db.execute("INSERT OR REPLACE INTO meta VALUES ('in_flight_at_stop', ?)", (json.dumps(total),))
            return Recovered(int(count), float(worst), in_batches)

        result: Recovered = self._write().run_sync(op)
        return result

    def spend(self) -> Spend:
        answered, maybe = self._db.execute(
            "SELECT coalesce(sum(answered_usd), 0), coalesce(sum(maybe_billed_usd), 0) FROM charges"
            if self._has_table("charges")  # a state from before charges (read only): its answers' costs
            else "SELECT coalesce(sum(cost_usd), 0), 0 FROM results"
        ).fetchone()
        (in_flight,) = self._db.execute(
            "SELECT coalesce(sum(worst_usd), 0) FROM intents" if self._has_table("intents") else "SELECT 0"
        ).fetchone()
        return Spend(float(answered), float(maybe), float(in_flight))

    def spend_by_group(self) -> dict[str, float]:
        """Dollars charged per group of requests (see :mod:`._groups`)."""
        return spend_by_group_op(self._db)

    def summary(self) -> dict[str, Any]:
        """Counts, tokens, cost and attempts over every stored result."""
        row = self._db.execute(
            "SELECT count(*), coalesce(sum(ok),0), coalesce(sum(input_tokens),0),"
            " coalesce(sum(output_tokens),0), coalesce(sum(attempts),0),"
            " min(finished_at), max(finished_at) FROM results"
        ).fetchone()
        errors = dict(
            self._db.execute(
                "SELECT error_type, count(*) FROM results WHERE ok = 0 GROUP BY error_type ORDER BY 2 DESC"
            ).fetchall()
        )
        (priced,) = self._db.execute(
            "SELECT count(*) FROM charges"
            if self._has_table("charges")
            else "SELECT count(*) FROM results WHERE cost_usd > 0"
        ).fetchone()
        embedded = self._db.execute(
            "SELECT count(*), coalesce(sum(ok), 0) FROM embeddings" if self._has_table("embeddings") else "SELECT 0, 0"
        ).fetchone()
        spend = self.spend()
        return {
            "results": row[0],
            "succeeded": row[1],
            "failed": row[0] - row[1],
            "input_tokens": row[2],
            "output_tokens": row[3],
            "cost_usd": spend.total if priced or spend.in_flight else None,
            "spend": spend,
            "attempts": row[4],
            "first_finished_at": row[5],
            "last_finished_at": row[6],
            "errors": errors,
            "embeddings": embedded[0],
            "embeddings_ok": embedded[1],
        }

    def structured_summary(self) -> dict[str, Any] | None:
        """Answers to requests with a schema: valid, valid after re-asks, invalid, the
        re-asks made and what they cost; None when no stored answer had a schema."""
        row = self._db.execute(
            "SELECT count(*), coalesce(sum(ok), 0), coalesce(sum(ok AND json_extract(record, '$.reasks') > 0), 0),"
            " coalesce(sum(json_extract(record, '$.reasks')), 0),"
            " coalesce(sum(json_extract(record, '$.reask_cost_usd')), 0),"
            " coalesce(sum(error_type = 'invalid_output'), 0)"
            " FROM results WHERE json_type(record, '$.reasks') IS NOT NULL"
        ).fetchone()
        if not row[0]:
            return None
        return {
            "lines": row[0],
            "valid": row[1],
            "reasked": row[2],
            "reasks": row[3],
            "reask_cost_usd": row[4],
            "invalid": row[5],
        }

    def _has_table(self, name: str) -> bool:
        found = self._db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,))
        return found.fetchone() is not None

    def has_timeline(self) -> bool:
        """Whether the file keeps a timeline (one from before it does not)."""
        return has_timeline(self._db)

    def report_rows(self, name: str, limit: int = -1) -> Iterator[tuple[Any, ...]]:
        """Rows for ``sluice report``: a timeline table, or the results (see ``._timeline``)."""
        return report_rows(self._db, name, limit)

    def latencies(self) -> Iterator[float]:
        """Each answer's latency, but a provider batch's lines' (not timed one by one)."""
        query = "SELECT latency_s FROM results WHERE ok = 1 AND json_extract(record, '$.tier') IS NOT 'batch'"
        for (latency,) in self._db.execute(query):
            yield latency

    def batch_answers(self) -> int:
        """Answers a provider batch gave (``--tier batch``/``auto``)."""
        query = "SELECT count(*) FROM results WHERE ok = 1 AND json_extract(record, '$.tier') = 'batch'"
        return int(self._db.execute(query).fetchone()[0])

    # -- internals -------------------------------------------------------------------------

    def _write(self) -> Writer:
        if self._writer is None:
            raise StoreError(f"{self.path} is open read-only (or closed)")
        return self._writer

    def _close_quietly(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        db = getattr(self, "_db", None)
        if db is not None:
            db.close()

    def __repr__(self) -> str:
        return f"<SqliteStore {self.path}>"


#: ``PRAGMA application_id`` of a sluice state file ("SLCE"): tells it from other databases.
APPLICATION_ID = 0x534C4345


def _has_index(db: sqlite3.Connection, name: str) -> bool:
    return db.execute("SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = ?", (name,)).fetchone() is not None


def _key_index_op(*, keep: bool) -> Callable[[sqlite3.Connection], bool]:
    """An op that builds the key index (``keep``) or drops it from an empty results (a
    first run appends without it); returns whether results is indexed afterwards."""

    def op(db: sqlite3.Connection) -> bool:
        names = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
        if "sqlite_autoindex_results_1" in names:
            return True  # an older file's: it cannot be dropped, and it serves
        if keep:
            try:
                db.execute("CREATE UNIQUE INDEX IF NOT EXISTS results_key ON results(key)")
            except sqlite3.IntegrityError:  # never by design; if a key got two rows, the later one wins
                db.execute("DELETE FROM results WHERE rowid NOT IN (SELECT max(rowid) FROM results GROUP BY key)")
                db.execute("CREATE UNIQUE INDEX results_key ON results(key)")
            return True
        db.execute("DROP INDEX IF EXISTS results_key")
        return False

    return op


def _setup(db: sqlite3.Connection) -> None:
    """Open (and, from an older sluice, upgrade) the file on the writer's connection.

    A database that is not a sluice state (someone's app.db given as ``--state``) is
    refused before anything is written to it."""
    db.execute("PRAGMA busy_timeout=5000")
    _check_ours(db)
    version = _schema_version(db)
    if version is not None and version > SCHEMA_VERSION:
        raise ConfigError(
            f"{db_path(db)} was written by a newer sluice (state schema {version}; this one reads up to "
            f"{SCHEMA_VERSION}); upgrade sluice to resume that job, or give another --state"
        )
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute("PRAGMA wal_autocheckpoint=10000")
    db.executescript(_SCHEMA)
    if version is None or version < SCHEMA_VERSION:
        with db:
            db.execute("BEGIN IMMEDIATE")
            if version is None or version < 2:
                # A state written before charges were kept apart: its answers' costs are the charges.
                db.execute(
                    "INSERT OR IGNORE INTO charges (key, answered_usd) SELECT key, cost_usd FROM results"
                    " WHERE cost_usd > 0"
                )
            db.execute("INSERT OR REPLACE INTO meta VALUES ('schema', ?)", (json.dumps(SCHEMA_VERSION),))


def _schema_version(db: sqlite3.Connection) -> int | None:
    """The state schema the file says it has; None for a new file (or one from before versions)."""
    if not db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'").fetchone():
        return None
    row = db.execute("SELECT value FROM meta WHERE name = 'schema'").fetchone()
    try:
        return int(json.loads(row[0])) if row is not None else None
    except (ValueError, TypeError):
        raise sqlite3.DatabaseError(f"its schema version is not a number ({row[0]!r})") from None


def _check_ours(db: sqlite3.Connection) -> None:
    (app,) = db.execute("PRAGMA application_id").fetchone()
    tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    ours = app == APPLICATION_ID or (app == 0 and {"results", "meta"} <= tables)  # 0: an older sluice
    if tables and not ours:
        shown = ", ".join(sorted(tables)[:5])
        raise ConfigError(
            f"{db_path(db)} is a database of something else (tables: {shown}), not a sluice state file; "
            "give --state a file of its own"
        )
    if app != APPLICATION_ID:
        db.execute(f"PRAGMA application_id = {APPLICATION_ID}")


def db_path(db: sqlite3.Connection) -> str:
    row = db.execute("PRAGMA database_list").fetchone()
    return str(row[2]) if row and row[2] else "the database"


def _check_integrity(db: sqlite3.Connection, path: Path) -> None:
    """A damaged file is a clear error at open, not a traceback mid-job."""
    verdict = db.execute("PRAGMA quick_check").fetchone()
    if verdict is None or verdict[0] != "ok":
        raise sqlite3.DatabaseError(f"integrity check failed: {verdict[0] if verdict else 'no answer'}")
    db.execute("SELECT count(*) FROM results").fetchone()


def _settle_op(intent: int, charge: tuple[float, float], charge_sql: str) -> Any:
    def op(db: sqlite3.Connection) -> None:
        row = db.execute("SELECT key FROM intents WHERE id = ?", (intent,)).fetchone()
        if row is None:
            return
        db.execute("DELETE FROM intents WHERE id = ?", (intent,))
        if charge[0] or charge[1]:
            db.execute(charge_sql, (row[0], *charge))

    return op


def _kept(record: Mapping[str, Any]) -> bool:
    from .._records import error_from_record

    error = record.get("error")
    return isinstance(error, Mapping) and error_from_record(error).kept_on_rerun


def _result_row(key: str, result: Result) -> tuple[Any, ...]:
    return (
        key,
        int(result.ok),
        result.error.kind if result.error is not None else None,
        result.usage.input_tokens,
        result.usage.output_tokens,
        result.cost_usd,
        result.attempts,
        result.timings.latency,
        _json.dumps_text(result_record(result)),
        time.time(),
    )
