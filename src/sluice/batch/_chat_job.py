"""A batch job of chat requests: the input's lines through ``Engine.map`` into the output,
each answer durable in the state before its output line.

With ``--tier batch`` (not ``--ordered``) a line leaves memory while a provider batch holds
it (see ``_parked``): the input is read again for the lines of each batch that has ended.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import AsyncIterator, Callable, Container, Iterator

from .._errors import CancelledError, InvalidInputError, ParkedError, SluiceError
from .._models import Request, Result
from ..store import SqliteStore
from ..tiers import batch_request
from ._inputs import EMBEDDING_IN_CHAT_JOB, InputItem, read_inputs, request_of
from ._job import JobProgress, JobSpec
from ._output import DoneLines, JobOutput, OutputFile, output_record
from ._parked import ParkedLines
from ._running import engine_for, running

__all__ = ["stream_chat"]

#: Lines read again (their batch ended) in the engine at once: most are answered from the
#: journal at once, so a few hundred keep it busy.
_REENTRY_WINDOW = 500


async def stream_chat(
    spec: JobSpec,
    progress: JobProgress,
    store: SqliteStore,
    done: DoneLines,
    on_tick: Callable[[], None],
    file: OutputFile,
) -> None:
    # ordered output must hold every line until its turn: it keeps lines waiting in memory
    parking = ParkedLines() if spec.config.tier == "batch" and not spec.ordered else None
    engine = engine_for(spec, progress, store, on_ended=parking.ended if parking is not None else None)
    auto = spec.config.tier == "auto"  # each line asks its model's batch tier first
    pending: dict[int, InputItem] = {}
    numbering = itertools.count()

    def items(only: Container[int] | None, first: bool) -> Iterator[Request | SluiceError]:
        for item in read_inputs(spec.input, spec.inputs, only):
            if item.line in done:
                continue
            if item.error is not None and spec.strict:
                progress.strict_error = item.error.message
                return  # the records before it still finish
            if item.own_model is not None and first:
                progress.note_own_model(item.own_model)
            pending[next(numbering)] = item
            if item.error is not None:
                yield item.error
            elif item.embedding is not None:
                yield InvalidInputError(f"line {item.line}: {EMBEDDING_IN_CHAT_JOB}", line=item.line)
            else:
                yield batch_request(request_of(item, spec.cache)) if auto else request_of(item, spec.cache)

    async def source() -> AsyncIterator[Request | SluiceError]:
        for each in items(None, first=True):
            yield each
        if progress.strict_error is not None:
            return
        while parking is not None:  # the lines of each ended batch, read again
            due = await parking.next_due(lambda: not pending, lambda: progress.stopping)
            if not due:
                if progress.stopping:
                    return
                break
            for each in items(due, first=False):
                yield each
                while len(pending) > _REENTRY_WINDOW and not progress.stopping:  # answered at once: a
                    await parking.changed()  # burst would pile its results (and output lines) up in memory
        progress.source_exhausted = True

    output = JobOutput(file, progress)
    async with running(engine, store, output, progress, on_tick) as watch:

        def written(result: Result, sent: Request | None) -> None:
            progress.count(result, sent)
            watch(result)

        async for result in engine.map(source(), ordered=spec.ordered):
            assert result.index is not None
            item = pending.pop(result.index)
            if parking is not None:
                parking.nudge()  # room for the next line read again; and when empty, nothing more can park
            if isinstance(result.error, ParkedError):
                assert parking is not None
                parking.park(result.error.chunk, item.line)
                continue
            if parking is not None and (parks := parking.times(item.line)):
                # its sends: each batch that took it, and what followed its answer read from the journal
                result = dataclasses.replace(result, attempts=parks + max(0, result.attempts - 1))
            if isinstance(result.error, CancelledError):
                progress.not_done += 1  # not written: the rerun does it
                continue
            sent = request_of(item, spec.cache) if item.request is not None else None
            output.write_soon(output_record(item, result, sent), functools.partial(written, result, sent))
