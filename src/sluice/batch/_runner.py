"""A batch job: an input file streamed through the engine into an output file.

Durable and idempotent: the engine commits every answer to the SQLite state as it
lands, the output is appended after, and a rerun of the same command skips what the
output already holds, writes what only the state holds, and sends only the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .._engine import Engine
from .._errors import CancelledError, ConfigError, InvalidInputError, SluiceError
from .._models import Request, Result
from ..cli._config import JobConfig
from ..store import SqliteStore
from ._inputs import InputItem, InputOptions, count_records, read_inputs
from ._output import DoneLines, OutputWriter, output_record, prepare_output

__all__ = ["JobProgress", "JobSpec", "default_state_path", "run_job"]


def default_state_path(output: Path) -> Path:
    """``results.jsonl`` -> ``results.sluice.db``: found again by rerunning the same command."""
    return output.with_suffix(".sluice.db")


@dataclass(frozen=True, slots=True)
class JobSpec:
    input: Path
    output: Path
    state: Path
    config: JobConfig
    inputs: InputOptions
    ordered: bool = False
    retry_failed: bool = False
    cache: bool = True
    strict: bool = False
    restart: bool = False


@dataclass(slots=True)
class JobProgress:
    """Live counters of a job, read by the progress display and the summary."""

    total: int = 0
    already_done: int = 0
    repaired_bytes: int = 0
    redone: int = 0
    written: int = 0
    succeeded: int = 0
    failed: int = 0
    invalid: int = 0
    from_store: int = 0
    not_done: int = 0
    started: float = field(default_factory=time.monotonic)
    finished: float | None = None
    stopping: bool = False
    strict_error: str | None = None
    engine: Engine | None = None
    errors: dict[str, int] = field(default_factory=dict)
    #: Dollars spent by earlier runs of this job (from the state file).
    spent_before: float = 0.0
    #: The whole input was read (not stopped early by --strict, Ctrl-C or an error).
    source_exhausted: bool = False

    @property
    def complete(self) -> bool:
        """Every record of the input has its record in the output."""
        return self.source_exhausted and not self.not_done and not self.stopping and self.strict_error is None

    @property
    def done(self) -> int:
        return self.already_done + self.written

    def count(self, result: Result) -> None:
        self.written += 1
        if result.cached:
            self.from_store += 1
        if result.ok:
            self.succeeded += 1
            return
        self.failed += 1
        kind = result.error.kind if result.error is not None else "error"
        if kind == "invalid_input":
            self.invalid += 1
        self.errors[kind] = self.errors.get(kind, 0) + 1

    def stop(self) -> None:
        """Stop admitting; in-flight requests finish and are recorded."""
        self.stopping = True
        if self.engine is not None:
            self.engine.stop()


def _check_paths(spec: JobSpec) -> None:
    if not spec.input.is_file():
        raise InvalidInputError(f"{spec.input}: no such input file")
    if spec.input.resolve() == spec.output.resolve():
        raise ConfigError("the output file must not be the input file")
    if spec.input.stat().st_size == 0:
        raise InvalidInputError(f"{spec.input} is empty: there are no requests to run")


def _claim_state(store: SqliteStore, spec: JobSpec) -> None:
    """A state file belongs to one input; refuse to mix two jobs' results by line number."""
    previous = store.meta().get("input")
    here = str(spec.input.resolve())
    if previous and previous != here and not spec.restart:
        raise ConfigError(
            f"{spec.state} is the state of a job over {previous}; give another -o or --state, "
            "or --restart to start over (stored answers are still reused)"
        )


@contextlib.contextmanager
def _exclusive(state: Path) -> Iterator[None]:
    """One process per job: two runs on one output would send everything twice.

    An flock on the state file itself (SQLite's own locks are fcntl locks, which flock
    does not interfere with on Linux), released by the kernel if the process dies.
    """
    import fcntl

    state.parent.mkdir(parents=True, exist_ok=True)
    with open(state, "ab") as handle:
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
    _check_paths(spec)
    with _exclusive(spec.state):
        await _run_locked(spec, progress, on_tick)


async def _run_locked(spec: JobSpec, progress: JobProgress, on_tick: Callable[[], None]) -> None:
    store = SqliteStore(spec.state)
    try:
        _claim_state(store, spec)
        if spec.restart:
            spec.output.unlink(missing_ok=True)
        prepared = prepare_output(spec.output, retry_failed=spec.retry_failed)
        progress.total = count_records(spec.input, spec.inputs)
        progress.already_done = prepared.kept
        progress.redone = prepared.dropped
        progress.repaired_bytes = prepared.repaired_bytes
        if "started_at" not in store.meta():
            store.set_meta(started_at=time.time())
        store.set_meta(
            input=str(spec.input.resolve()),
            output=str(spec.output.resolve()),
            status="running",
            pid=os.getpid(),
            run_started_at=time.time(),
            total=progress.total,
            argv=sys.argv[1:],
        )
        await _stream(spec, progress, store, prepared.done, on_tick)
    finally:
        progress.finished = time.monotonic()
        status = "finished"
        if not progress.complete:
            status = "interrupted"
        with contextlib.suppress(SluiceError):
            store.set_meta(status=status, finished_at=time.time(), written=progress.done)
        store.close()


async def _stream(
    spec: JobSpec, progress: JobProgress, store: SqliteStore, done: DoneLines, on_tick: Callable[[], None]
) -> None:
    config = spec.config
    engine = Engine(
        config.deployments,
        retry=config.retry,
        concurrency=config.concurrency,
        store=store,
        retry_failed=spec.retry_failed,
        budget_usd=config.budget_usd,
        allow_unpriced=config.allow_unpriced,
    )
    progress.engine = engine
    progress.spent_before = store.summary()["cost_usd"] or 0.0
    if engine.spending.budget is not None:  # the budget is the job's, over all its runs
        engine.spending.budget.add_spent(progress.spent_before)
    if progress.stopping:
        engine.stop()
    pending: dict[int, InputItem] = {}
    numbering = itertools.count()

    def source() -> Iterator[Request | SluiceError]:
        for item in read_inputs(spec.input, spec.inputs):
            if item.line in done:
                continue
            if item.error is not None and spec.strict:
                progress.strict_error = item.error.message
                return  # the records before it still finish
            pending[next(numbering)] = item
            if item.error is not None:
                yield item.error
            else:
                yield _request_of(item, spec.cache)
        progress.source_exhausted = True

    writer = OutputWriter(spec.output)
    ticker = asyncio.get_running_loop().create_task(_tick(writer, on_tick))
    try:
        async with engine:
            async for result in engine.map(source(), ordered=spec.ordered):
                assert result.index is not None
                item = pending.pop(result.index)
                if isinstance(result.error, CancelledError):
                    progress.not_done += 1  # not written: the rerun does it
                    continue
                writer.write(output_record(item, result))
                progress.count(result)
    finally:
        ticker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ticker
        writer.close()
        on_tick()


def _request_of(item: InputItem, cache: bool) -> Request:
    """With --no-cache a record is keyed by its line, so identical lines are not shared."""
    assert item.request is not None
    if cache or item.request.id is not None:
        return item.request
    return dataclasses.replace(item.request, id=f"line-{item.line}")


async def _tick(writer: OutputWriter, on_tick: Callable[[], None]) -> None:
    while True:
        await asyncio.sleep(0.25)
        writer.flush()
        on_tick()
