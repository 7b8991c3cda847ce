"""A batch job of chat requests: the input's lines through ``Engine.map`` into the output,
each answer durable in the state before its output line.

With ``--tier batch`` or ``auto`` (not ``--ordered``) a line leaves memory while a provider
batch holds it (see ``_parked``): a second ``map`` over the same engine reads the lines of
each batch that has ended from the input again, beside the first reading (which must
not wait for it: a batch being gathered would go out part-full).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import itertools
from collections.abc import AsyncIterator, Callable, Container, Iterable, Iterator

from .._engine import Engine
from .._errors import CancelledError, InvalidInputError, ParkedError, SluiceError
from .._models import Priority, Request, Result, idempotency_key_of, store_key
from ..store import SqliteStore
from ..tiers import batch_request
from ._cache_plan import FilePlan, plan_file
from ._inputs import EMBEDDING_IN_CHAT_JOB, InputItem, read_inputs, read_jsonl_at, request_of
from ._job import JobProgress, JobSpec
from ._offsets import LineOffsets
from ._output import DoneLines, JobOutput, OutputFile, output_record
from ._parked import ParkedLines
from ._running import engine_for, running
from ._writeback import WriteBack

__all__ = ["stream_chat"]

#: Lines read again (their batch ended) in the engine at once: most are answered from the
#: state at once, so a burst would pile its results and output lines up in memory.
_REENTRY_WINDOW = 2000


def parks(spec: JobSpec, progress: JobProgress) -> bool:
    """Whether the job's lines leave memory while provider batches hold them: only when
    more are left than the two batches' worth that may wait in memory anyway (parking costs
    each line a second pass through the engine), and never for ordered output (which
    holds every line until its turn)."""
    tiered = spec.config.tier in ("batch", "auto")
    return tiered and not spec.ordered and progress.left > 2 * spec.config.batch.max_lines


async def stream_chat(
    spec: JobSpec,
    progress: JobProgress,
    store: SqliteStore,
    done: DoneLines,
    on_tick: Callable[[], None],
    file: OutputFile,
) -> None:
    parking = ParkedLines() if parks(spec, progress) else None
    engine = engine_for(spec, progress, store, on_ended=parking.ended if parking is not None else None)
    auto = spec.config.tier == "auto"  # each line asks its model's batch tier first
    # the batch tier cuts a provider batch every max_lines lines: the plan keeps groups whole in one
    chunk = spec.config.batch.max_lines if spec.config.tier in ("batch", "auto") else None
    offsets = LineOffsets() if parking is not None else None  # lines read again are sought, not scanned for
    pending: dict[int, InputItem] = {}  # lines of the first reading in the engine, by index
    again: dict[int, InputItem] = {}  # lines read again in the engine, by index
    first_done = False  # the first reading got to the end of the input
    first_over = False  # it ended (at the end, or stopped by --strict)

    def items(
        only: Container[int] | None,
        into: dict[int, InputItem],
        numbering: Iterator[int],
        source: Iterable[InputItem] | None = None,
    ) -> Iterator[Request | SluiceError]:
        """The input's lines (``only``: those; ``source``: these, read already), each kept in
        ``into`` under its index in the map that takes it (``numbering``: that map's count)."""
        if source is None:
            source = read_inputs(spec.input, spec.inputs, only, offsets)
        if only is None and plan is not None and plan.reordered:  # group by group (see _cache_plan)
            source = read_jsonl_at(spec.input, spec.inputs, plan.order(chunk))
        for item in source:
            if item.line in done:
                continue
            if item.error is not None and spec.strict:
                progress.strict_error = item.error.message
                return  # the records before it still finish
            if item.own_model is not None and only is None:
                progress.note_own_model(item.own_model)
            into[next(numbering)] = item
            if item.error is not None:
                yield item.error
            elif item.embedding is not None:
                yield InvalidInputError(f"line {item.line}: {EMBEDDING_IN_CHAT_JOB}", line=item.line)
            else:
                yield batch_request(request_of(item, spec.cache)) if auto else request_of(item, spec.cache)

    # the engine's room is shared: lines of the first reading waiting for money that only
    # parked lines can give back (once answered) must leave them room to come back in
    again_room = min(_REENTRY_WINDOW, engine.concurrency // 2)
    first_room = engine.concurrency - again_room

    def whole_input() -> Iterator[Request | SluiceError]:
        nonlocal first_done
        yield from items(None, pending, itertools.count())
        first_done = progress.strict_error is None  # read to its end (not cut off by a stop)

    async def first_reading() -> AsyncIterator[Request | SluiceError]:
        nonlocal first_done, first_over
        try:
            for each in items(None, pending, itertools.count()):
                yield each
                while parking is not None and len(pending) >= first_room and not progress.stopping:
                    await parking.changed()
            first_done = progress.strict_error is None
        finally:
            first_over = True
            if parking is not None:
                parking.nudge()

    async def reading_again() -> AsyncIterator[Request | SluiceError]:
        """The lines of each batch that has ended, until none is parked or can still park."""
        assert parking is not None
        numbering = itertools.count()
        while True:
            due = await parking.next_due(lambda: first_over and not pending and not again, lambda: progress.stopping)
            if not due:
                return
            for read in WriteBack.groups(read_inputs(spec.input, spec.inputs, due, offsets)):
                rest = read if writeback is None else await writeback.write(read)  # plain answers: written now
                for each in items(due, again, numbering, rest):
                    yield each
                    while len(again) >= again_room and not progress.stopping:
                        await parking.changed()

    plan = await cache_plan(spec, engine, done)
    output = JobOutput(file, progress)
    async with running(engine, store, output, progress, on_tick) as watch:

        def written(result: Result, sent: Request | None) -> None:
            progress.count(result, sent)
            watch(result)

        writeback = None if parking is None else WriteBack(spec, engine, store, output, progress, parking, watch)

        def unwritten(result: Result, sent: Request | None, line: int) -> None:
            """The output could not take it: the state has it, or it was never sent (the
            rerun does it, for nothing), or it is lost (the state failed too)."""
            if sent is not None and store.get(store_key(sent)) is not None:
                progress.not_written += 1
            elif result.attempts and not result.cached:
                progress.note_lost(line)
            else:
                progress.not_done += 1

        async def consume(results: AsyncIterator[Result], lines: dict[int, InputItem]) -> None:
            async for result in results:
                assert result.index is not None
                item = lines.pop(result.index)
                if parking is not None:
                    parking.nudge()  # room for the next line read again; and when empty, nothing more can park
                if isinstance(result.error, ParkedError):
                    assert parking is not None
                    parking.park(result.error.chunk, item.line)
                    continue
                if parking is not None and (parks := parking.times(item.line)):
                    # its sends: each batch that took it, and what followed its answer read from the state
                    result = dataclasses.replace(result, attempts=parks + max(0, result.attempts - 1))
                if isinstance(result.error, CancelledError):
                    progress.not_done += 1  # not written: the rerun does it
                    continue
                sent = request_of(item, spec.cache) if item.request is not None else None
                if auto and sent is not None and result.ok and result.tier == "sync":  # a batch may answer it too
                    progress.note_sync(idempotency_key_of(store_key(sent)))
                output.write_soon(
                    output_record(item, result, sent),
                    functools.partial(written, result, sent),
                    functools.partial(unwritten, result, sent, item.line),
                )

        if parking is None:  # one reading, as a plain generator (the common path: no await per line)
            await consume(engine.map(whole_input(), ordered=spec.ordered), pending)
            progress.source_exhausted = first_done
            return
        first = consume(engine.map(first_reading(), ordered=spec.ordered), pending)
        # read again ahead of lines waiting for a batch to gather (they are answered at once)
        rest = asyncio.ensure_future(consume(engine.map(reading_again(), priority=Priority.NORMAL), again))
        try:
            await first
        except BaseException:
            rest.cancel()
            raise
        await rest
        progress.source_exhausted = first_done and not progress.stopping and parking.waiting == 0


async def cache_plan(spec: JobSpec, engine: Engine, done: DoneLines) -> FilePlan | None:
    """The prompt-cache plan of the lines to do (see ``_cache_plan``), made off the loop;
    its counts handed to the engine's planner. Lines keep their order with ``--ordered``
    (the output's) and ``--strict`` (it stops at the first bad line of the file)."""
    cache = engine.attempts.caching
    if cache is None:
        return None
    reorder = not (spec.ordered or spec.strict)
    plan = await asyncio.to_thread(plan_file, spec.input, spec.inputs, done, reorder=reorder)
    if plan is not None:
        cache.adopt(plan.index)
    return plan
