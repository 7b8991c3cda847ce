"""A batch job: an input file streamed through the engine into an output file.

Durable and idempotent: the engine notes every attempt in the SQLite state before it is
sent and commits every answer as it lands, the output is appended after, and a rerun of
the same command skips what the output already holds, writes what only the state holds,
and sends only the rest. The output is only ever touched when it is this job's (its state
says so); the job's budget covers every run, crashed ones included.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import gc
import itertools
import os
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

from .. import _json
from .._engine import Engine
from .._errors import CancelledError, ConfigError, InvalidInputError, SluiceError, StoreError
from .._models import Request, Result, seal
from ..store import SqliteStore
from ._embed_inputs import embedding_hash
from ._inputs import InputItem, count_records, read_inputs
from ._job import FailFast, JobProgress, JobSpec
from ._output import DoneLines, OutputFile, looks_like_output, output_record, prepare_output, request_hash
from ._preflight import checked_spec

__all__ = ["JobProgress", "JobSpec", "default_state_path", "engine_for", "is_embedding_job", "run_job"]

EMBEDDING_IN_CHAT_JOB = (
    "an embeddings request in a job of chat requests (its first request is one); "
    "run embeddings from a file of their own"
)


def default_state_path(output: Path) -> Path:
    """``results.jsonl`` -> ``results.sluice.db``: found again by rerunning the same command."""
    return output.with_suffix(".sluice.db")


@contextlib.contextmanager
def _exclusive(state: Path) -> Iterator[None]:
    """One process per job: two runs on one state would send everything twice.

    An flock on the state file itself (SQLite's own locks are fcntl locks, which flock
    does not interfere with on Linux), released by the kernel if the process dies.
    """
    import fcntl

    try:
        handle = open(state, "ab")  # noqa: SIM115 - held for the whole job
    except OSError as exc:
        raise StoreError(f"cannot open the state file {state}: {exc.strerror}") from None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(f"{state} is in use by a running sluice job; wait for it or stop it") from None
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


async def run_job(spec: JobSpec, progress: JobProgress, on_tick: Callable[[], None] = lambda: None) -> None:
    """Run the job to the end, or until stopped; every answer is on disk when it returns."""
    spec = checked_spec(spec)  # before any file is created or request sent
    progress.grace = spec.grace
    with _exclusive(spec.state), _fewer_collections():
        await _run_locked(spec, progress, on_tick)


@contextlib.contextmanager
def _fewer_collections() -> Iterator[None]:
    """A job's objects mostly die young and acyclic, yet at CPython's default threshold
    (a collection per 700 net allocations) the cyclic GC took ~17 % of a job's CPU,
    re-walking everything the run holds (imports, prices, the limiter's ledger). Collect
    a hundred times less often, and leave what exists at the start out of it; both are
    restored afterwards (a job may run inside someone else's process)."""
    threshold = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(max(threshold[0], 70_000), *threshold[1:])
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()


def _claim_state(store: SqliteStore, spec: JobSpec) -> None:
    """A state file belongs to one input; refuse to mix two jobs' results by line number."""
    previous = store.meta().get("input")
    if previous and previous != str(spec.input) and not spec.restart:
        raise ConfigError(
            f"{spec.state} is the state of a job over {previous}; give another -o or --state, "
            "or --restart to start over (stored answers are still reused)"
        )


def _claim_output(store: SqliteStore, spec: JobSpec, progress: JobProgress, output: OutputFile) -> None:
    """Touch the output only when it is this job's, or the user said to replace it."""
    path = spec.output
    mine = store.meta().get("output") == str(path)
    if not output.existed or output.size == 0:
        return
    if spec.overwrite or (spec.restart and mine):
        output.start_over()
        return
    if mine:
        return
    if not looks_like_output(path):
        raise ConfigError(
            f"{path} already exists and was not written by this job; choose another -o, "
            "or add --overwrite to replace it"
        )
    if spec.adopt_output:
        progress.adopted = True
        return
    raise ConfigError(
        f"{path} holds sluice records, but its state file {spec.state} does not know it (the state was "
        "deleted or replaced, or this is another job's output). Rerun with the --state that wrote it; or add "
        "--adopt-output to continue from its records (their cost counts against --budget; requests that were "
        "in flight when its state was lost are not known); or --overwrite to start over"
    )


async def _run_locked(spec: JobSpec, progress: JobProgress, on_tick: Callable[[], None]) -> None:
    total = count_records(spec.input, spec.inputs)
    # _exclusive() holds the state's lock; the record count sizes its first run's key filter
    store = SqliteStore(spec.state, exclusive=True, expected_keys=total)
    output: OutputFile | None = None
    try:
        _claim_state(store, spec)
        output = OutputFile(spec.output)  # locked from here to the end: one job per output
        try:
            _claim_output(store, spec, progress, output)
        except SluiceError:
            output.discard()  # refused: leave no file behind that was not there
            output = None
            raise
        progress.recovered = store.recover_intents()
        progress.total = total
        prepared = prepare_output(
            output, retry_failed=spec.retry_failed, total=progress.total, line_hashes=lambda: _line_hashes(spec)
        )
        progress.already_done = prepared.kept
        progress.redone = prepared.dropped
        progress.kept_failures = prepared.kept_failures
        progress.changed = prepared.changed
        progress.repaired_bytes = prepared.repaired_bytes
        progress.spend_before = store.spend()
        progress.spent_before = max(progress.spend_before.total, prepared.cost_usd)
        meta = store.meta()
        if "started_at" not in meta:
            store.set_meta(started_at=time.time())
        store.set_meta(
            runs=int(meta.get("runs") or (1 if "run_started_at" in meta else 0)) + 1,
            deployments_earlier=fold_deployments(meta.get("deployments_earlier"), meta.get("deployments")),
            deployments=[],
        )
        store.set_meta(
            input=str(spec.input),
            output=str(spec.output),
            status="running",
            pid=os.getpid(),
            run_started_at=time.time(),
            total=progress.total,
            argv=sys.argv[1:],
        )
        if spec.distributed is not None:
            from ._distributed import coordinate  # here: only a distributed job imports redis

            await coordinate(spec, progress, store, prepared.done, on_tick, output)
        elif is_embedding_job(spec):
            from ._embed_job import stream_embeddings  # here: it reuses this module's parts

            await stream_embeddings(spec, progress, store, prepared.done, on_tick, output)
        else:
            await _stream(spec, progress, store, prepared.done, on_tick, output)
    finally:
        if output is not None:
            _Output(output, progress).close()
        progress.finished = time.monotonic()
        status = "finished" if progress.complete else "interrupted"
        with contextlib.suppress(SluiceError):
            store.set_meta(status=status, finished_at=time.time(), written=progress.done)
        store.close()


def _line_hashes(spec: JobSpec) -> Iterator[tuple[int, str]]:
    for item in read_inputs(spec.input, spec.inputs):
        if item.request is not None:
            yield item.line, request_hash(_request_of(item, spec.cache))
        elif item.embedding is not None:
            yield item.line, embedding_hash(item.embedding)


def is_embedding_job(spec: JobSpec) -> bool:
    """Whether the job embeds texts (``--embed``, or its first request is an embeddings
    line); its other kind of line is then refused, one endpoint per file as in OpenAI's
    Batch API."""
    if spec.inputs.embed_field is not None:
        return True
    for item in read_inputs(spec.input, spec.inputs):
        if item.request is not None or item.embedding is not None:
            return item.embedding is not None
    return False


def engine_for(spec: JobSpec, progress: JobProgress, store: SqliteStore) -> Engine:
    """The job's engine: its config's deployments, limits and budget (which counts what
    earlier runs spent)."""
    config = spec.config
    engine = Engine(
        config.deployments,
        retry=config.retry,
        concurrency=config.concurrency,
        store=store,
        retry_failed=spec.retry_failed,
        budget_usd=config.budget_usd,
        allow_unpriced=config.allow_unpriced,
        defaults=config.defaults,
        fallbacks=config.fallbacks,
        cooldown=config.cooldown,
        grace=spec.grace,
    )
    progress.engine = engine
    if engine.spending.budget is not None:  # the budget is the job's, over all its runs
        engine.spending.budget.add_spent(progress.spent_before)
    if progress.stopping:
        engine.stop()
    return engine


async def _stream(
    spec: JobSpec,
    progress: JobProgress,
    store: SqliteStore,
    done: DoneLines,
    on_tick: Callable[[], None],
    file: OutputFile,
) -> None:
    engine = engine_for(spec, progress, store)
    pending: dict[int, InputItem] = {}
    numbering = itertools.count()

    def source() -> Iterator[Request | SluiceError]:
        for item in read_inputs(spec.input, spec.inputs):
            if item.line in done:
                continue
            if item.error is not None and spec.strict:
                progress.strict_error = item.error.message
                return  # the records before it still finish
            if item.own_model is not None:
                progress.note_own_model(item.own_model)
            pending[next(numbering)] = item
            if item.error is not None:
                yield item.error
            elif item.embedding is not None:
                yield InvalidInputError(f"line {item.line}: {EMBEDDING_IN_CHAT_JOB}", line=item.line)
            else:
                yield _request_of(item, spec.cache)
        progress.source_exhausted = True

    output = _Output(file, progress)
    async with running(engine, store, output, progress, on_tick) as watch:

        def written(result: Result, sent: Request | None) -> None:
            progress.count(result, sent)
            watch(result)

        async for result in engine.map(source(), ordered=spec.ordered):
            assert result.index is not None
            item = pending.pop(result.index)
            if isinstance(result.error, CancelledError):
                progress.not_done += 1  # not written: the rerun does it
                continue
            sent = _request_of(item, spec.cache) if item.request is not None else None
            output.write_soon(output_record(item, result, sent), functools.partial(written, result, sent))


@contextlib.asynccontextmanager
async def running(
    engine: Engine, store: SqliteStore, output: _Output, progress: JobProgress, on_tick: Callable[[], None]
) -> AsyncIterator[Callable[[Result], None]]:
    """The engine at work for a job: progress ticking and the output flushed meanwhile;
    afterwards the output closed, the store's failure (if any) noted, each deployment's
    state saved for ``sluice report``. Yields the check each written result goes through
    (a job whose first requests all fail the same way stops early)."""
    fail_fast = FailFast(progress.total)

    def watch(result: Result) -> None:
        verdict = fail_fast.observe(result)
        if verdict is not None and progress.fatal is None:
            progress.fatal = verdict
            progress.stop()

    ticker = asyncio.get_running_loop().create_task(
        _tick(output, on_tick, lambda: _note_deployments(store, engine, progress.done))
    )
    try:
        async with engine:
            yield watch
    finally:
        ticker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ticker
        output.close()
        progress.deployments = engine.deployment_status()  # while the loop runs: cooldowns still count
        if engine.store_error is not None:
            progress.store_error = engine.store_error.message
        else:
            _note_deployments(store, engine, progress.done)
        on_tick()


def _note_deployments(store: SqliteStore, engine: Engine, written: int) -> None:
    """Each deployment's state this run (cooling down, answered, failed), and the records
    written so far, for `sluice report` on a running or interrupted job."""
    rows = [dataclasses.asdict(status) for status in engine.deployment_status()]
    with contextlib.suppress(SluiceError):
        store.set_meta_soon(deployments=rows, deployments_at=time.time(), written=written)


def fold_deployments(earlier: object, last_run: object) -> dict[str, dict[str, int]]:
    """Answers and failed attempts per deployment over every run before this one: the
    totals so far plus the last run's rows (which `_note_deployments` wrote)."""
    totals: dict[str, dict[str, int]] = {}
    if isinstance(earlier, dict):
        for label, counts in earlier.items():
            if isinstance(counts, dict):
                totals[str(label)] = {k: int(counts.get(k) or 0) for k in ("answered", "failed")}
    for row in last_run if isinstance(last_run, list) else ():
        if isinstance(row, dict) and row.get("deployment") is not None:
            counts = totals.setdefault(str(row["deployment"]), {"answered": 0, "failed": 0})
            for k in ("answered", "failed"):
                counts[k] += int(row.get(k) or 0)
    return totals


class _Output:
    """The output writer, with a failure (disk full...) turned into a clean stop.

    :meth:`write_soon` gathers the records of one event-loop tick into one ``write``: a
    fast job lands a dozen answers a tick, and a write (with the file-system journal it
    touches) per record was a large part of a job's own cost."""

    def __init__(self, writer: OutputFile, progress: JobProgress) -> None:
        self._writer = writer
        self._progress = progress
        self._lines: list[bytes] = []
        self._then: list[Callable[[], None]] = []

    def write(self, record: dict[str, object]) -> bool:
        """Write one record now; False (and the job stops) when the file cannot take it."""
        self.flush()  # after what was queued before it
        return self._write([_json.dumps_line(record)])

    def write_soon(self, record: dict[str, object], then: Callable[[], None]) -> None:
        """Queue a record for this tick's write; ``then`` runs once it is in the file (never,
        if the file cannot take it: the job stops, the answer is in the state)."""
        if self._progress.output_error is not None:
            self._progress.not_written += 1
            return
        if not self._lines:
            asyncio.get_running_loop().call_soon(self.flush)
        self._lines.append(_json.dumps_line(record))
        self._then.append(then)

    def flush(self) -> None:
        """Write what is queued."""
        lines, then = self._lines, self._then
        if not lines:
            return
        self._lines, self._then = [], []
        if self._write(lines):
            for written in then:
                written()

    def close(self) -> None:
        self.flush()
        try:
            self._writer.close()
        except OSError as exc:
            self._failed(exc)

    def _write(self, lines: list[bytes]) -> bool:
        if self._progress.output_error is None:
            try:
                self._writer.write_lines(lines)
                return True
            except OSError as exc:
                self._failed(exc)
        self._progress.not_written += len(lines)
        return False

    def _failed(self, exc: OSError) -> None:
        if self._progress.output_error is None:
            self._progress.output_error = f"cannot write the output {self._writer.path}: {exc.strerror or exc}"
            self._progress.stop()


def _request_of(item: InputItem, cache: bool) -> Request:
    """With --no-cache a record is keyed by its line, so identical lines are not shared."""
    assert item.request is not None
    if cache or item.request.id is not None:
        return seal(item.request)  # its key is needed twice: by the engine and for request_hash
    return dataclasses.replace(item.request, id=f"line-{item.line}")


async def _tick(output: _Output, on_tick: Callable[[], None], note: Callable[[], None]) -> None:
    ticks = 0
    while True:
        await asyncio.sleep(0.25)
        output.flush()
        on_tick()
        ticks += 1
        if ticks % 8 == 0:  # every 2 s: what `sluice report` shows of a running job
            note()
