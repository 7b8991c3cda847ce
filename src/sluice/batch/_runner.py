"""A batch job: an input file streamed through the engine into an output file.

The runner checks the job, takes its state and its output, prepares both for a rerun,
and hands the work to the job of the input's kind beside it: chat lines
(:mod:`._chat_job`), embeddings (:mod:`._embed_job`), or, with ``--redis``, the
distributed coordinator (:mod:`._distributed`).

Durable and idempotent: the engine notes every attempt in the SQLite state before it is
sent and commits every answer as it lands, the output is appended after, and a rerun of
the same command skips what the output already holds, writes what only the state holds,
and sends only the rest. The output is only ever touched when it is this job's (its state
says so); the job's budget covers every run, crashed ones included.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from .._errors import ConfigError, SluiceError, StoreError
from ..store import SqliteStore
from ._embed_inputs import embedding_hash
from ._inputs import count_records, embeds, read_inputs, request_of
from ._job import JobProgress, JobSpec
from ._output import JobOutput, OutputFile, looks_like_output, prepare_output, request_hash
from ._preflight import checked_spec
from ._room import DiskRoom
from ._running import fold_deployments
from ._timeline import note_run

__all__ = ["JobProgress", "JobSpec", "default_state_path", "run_job"]


def default_state_path(output: Path) -> Path:
    """``results.jsonl`` -> ``results.sluice.db``: found again by rerunning the same command."""
    return output.with_suffix(".sluice.db")


@contextlib.contextmanager
def exclusive(state: Path) -> Iterator[None]:
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
    created = not spec.state.exists()
    with exclusive(spec.state), fewer_collections():
        await _run_locked(spec, progress, on_tick, created=created)


@contextlib.contextmanager
def fewer_collections() -> Iterator[None]:
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
    """A state file belongs to one input; refuse to mix two jobs' results by line number.
    Lines waiting in provider batches are collected only by a run that follows batches:
    a synchronous one would send them again while the batches answer them too."""
    previous = store.meta().get("input")
    if previous and previous != str(spec.input) and not spec.restart:
        raise ConfigError(
            f"{spec.state} is the state of a job over {previous}; give another -o or --state, "
            "or --restart to start over (stored answers are still reused)"
        )
    if spec.config.tier not in ("batch", "auto"):
        waiting = sum(len(chunk.custom_ids) for chunk in store.open_chunks())
        if waiting:
            raise ConfigError(
                f"{waiting:,} lines of this job wait in provider batches of an earlier --tier batch run; a "
                "synchronous run would send them again while the batches answer them: rerun with --tier batch "
                f"(or auto) to collect them (first `sluice cancel {spec.output}` to stop the batches: the batch "
                "rerun then collects what they finished and sends the rest)"
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


async def _run_locked(spec: JobSpec, progress: JobProgress, on_tick: Callable[[], None], *, created: bool) -> None:
    """The job, its state locked (``created``: by this run). A refusal (a claim, or an engine
    that would not start: nothing sent) leaves no file behind that this run made."""
    refused = False
    dispatched = False
    total = count_records(spec.input, spec.inputs)
    room = DiskRoom((spec.state, spec.output), spec.config.concurrency)  # see _room: no answer lost to a full disk
    # exclusive() holds the state's lock; the record count sizes its first run's key filter
    try:
        store = SqliteStore(
            spec.state, exclusive=True, expected_keys=total, timeline=True, on_full=lambda: room.release(spec.state)
        )
    except BaseException:
        room.close()
        raise
    output: OutputFile | None = None
    try:
        _claim_state(store, spec)
        output = OutputFile(spec.output, room)  # locked from here to the end: one job per output
        _claim_output(store, spec, progress, output)  # refused: no file is left behind that was not there
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
        note_run(store, spec.config)
        store.set_meta(
            input=str(spec.input),
            output=str(spec.output),
            status="running",
            pid=os.getpid(),
            run_started_at=time.time(),
            total=progress.total,
            argv=sys.argv[1:],
        )
        dispatched = True
        if spec.distributed is not None:
            from ._distributed import coordinate  # here: only a distributed job imports redis

            await coordinate(spec, progress, store, prepared.done, on_tick, output)
        elif embeds(spec.input, spec.inputs):
            from ._embed_job import stream_embeddings

            await stream_embeddings(spec, progress, store, prepared.done, on_tick, output)
        else:
            from ._chat_job import stream_chat

            await stream_chat(spec, progress, store, prepared.done, on_tick, output)
    except SluiceError:
        sent_nothing = spec.distributed is None and (progress.engine is None or not progress.engine.stats.attempts)
        refused = not dispatched or sent_nothing
        if refused and output is not None:
            output.discard()  # removed if this run made it
            output = None
        raise
    finally:
        if output is not None:
            JobOutput(output, progress).close()
        progress.finished = time.monotonic()
        status = "finished" if progress.complete else "interrupted"
        with contextlib.suppress(SluiceError):
            store.set_meta(status=status, finished_at=time.time(), written=progress.done)
        store.close()
        room.close()
        if refused and created:
            _remove_state(spec.state)


def _remove_state(state: Path) -> None:
    for path in (state, *(Path(f"{state}{suffix}") for suffix in ("-wal", "-shm", "-journal"))):
        with contextlib.suppress(OSError):
            path.unlink()


def _line_hashes(spec: JobSpec) -> Iterator[tuple[int, str]]:
    for item in read_inputs(spec.input, spec.inputs):
        if item.request is not None:
            yield item.line, request_hash(request_of(item, spec.cache))
        elif item.embedding is not None:
            yield item.line, embedding_hash(item.embedding)
