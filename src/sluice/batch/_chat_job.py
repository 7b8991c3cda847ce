"""A batch job of chat requests: the input's lines through ``Engine.map`` into the output,
each answer durable in the state before its output line."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterator

from .._errors import CancelledError, InvalidInputError, SluiceError
from .._models import Request, Result
from ..store import SqliteStore
from ..tiers import batch_request
from ._inputs import EMBEDDING_IN_CHAT_JOB, InputItem, read_inputs, request_of
from ._job import JobProgress, JobSpec
from ._output import DoneLines, JobOutput, OutputFile, output_record
from ._running import engine_for, running

__all__ = ["stream_chat"]


async def stream_chat(
    spec: JobSpec,
    progress: JobProgress,
    store: SqliteStore,
    done: DoneLines,
    on_tick: Callable[[], None],
    file: OutputFile,
) -> None:
    engine = engine_for(spec, progress, store)
    auto = spec.config.tier == "auto"  # each line asks its model's batch tier first
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
                yield batch_request(request_of(item, spec.cache)) if auto else request_of(item, spec.cache)
        progress.source_exhausted = True

    output = JobOutput(file, progress)
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
            sent = request_of(item, spec.cache) if item.request is not None else None
            output.write_soon(output_record(item, result, sent), functools.partial(written, result, sent))
