"""A batch job of embeddings: every line's texts through the engine's embeddings pipeline,
one output record per line.

The job is the chat job's (``_runner``: the same state, output ownership, resume, stop,
fail-fast and exit status) with another middle: lines are not sent one by one but their
texts packed across lines into shared requests (``sluice._embeddings``), each text stored
in the state as its vector lands; a line's record is written once all its texts are
back. So a rerun writes the lines the output lacks from the state and embeds only texts
the state does not hold. The source is read only as room frees up, and a record is
written as its line completes: memory stays flat however long the file.

A record: ``line``, ``id`` (``custom_id``, the ``--id-field`` value, else the text's
key), ``ok``, ``embedding`` (a list of numbers; a list of them for a line whose input was
a list; base64 float32 when the line asked ``encoding_format: "base64"``), ``error``,
``usage``, ``cost_usd`` (the line's share of its requests'), ``attempts``, ``latency_s``,
``deployment``, ``cached``, ``request_hash``, ``metadata``.
"""

from __future__ import annotations

import base64
import itertools
import sys
from array import array
from collections.abc import Callable, Iterator
from typing import Any

from .._embeddings import EmbeddingResult, EmbedItem, EmbedPipeline, EmbedSpec
from .._errors import CancelledError, InvalidInputError, SluiceError
from .._models import Priority, Result, Usage
from .._records import error_record, usage_record
from ..store import SqliteStore
from ._embed_inputs import EmbeddingInput, embedding_hash
from ._inputs import InputItem, read_inputs
from ._job import JobProgress, JobSpec
from ._output import DoneLines, JobOutput, OutputFile
from ._running import engine_for, running

__all__ = ["CHAT_IN_EMBEDDING_JOB", "EmbedLine", "stream_embeddings"]

CHAT_IN_EMBEDDING_JOB = (
    "a chat request in a job of embeddings (its first request is one); run chat requests from a file of their own"
)
#: The spec of an item that stands for a bad line (it is never sent).
_NO_SPEC = EmbedSpec("-")


class EmbedLine:
    """One input line's texts coming back, until its record (or, for ``sluice serve``, its
    Batch API output line) can be written."""

    __slots__ = (
        "attempts",
        "cached",
        "cancelled",
        "cost",
        "deployment",
        "error",
        "item",
        "key",
        "latency",
        "left",
        "tokens",
        "vectors",
    )

    def __init__(self, item: InputItem, texts: int) -> None:
        self.item = item
        self.left = texts
        self.vectors: list[array[float] | None] = [None] * texts
        self.error: SluiceError | None = None
        self.cancelled = False
        self.tokens = 0
        self.cost: float | None = None
        self.attempts = 0
        self.cached = True
        self.latency = 0.0
        self.deployment: str | None = None
        self.key: str | None = None

    def add(self, position: int, result: EmbeddingResult) -> bool:
        """One text is back; True when the line is complete."""
        self.left -= 1
        if isinstance(result.error, CancelledError):
            self.cancelled = True
        elif result.error is not None and self.error is None:
            self.error = result.error
        self.vectors[position] = result.vector
        self.tokens += result.usage.input_tokens
        if result.cost_usd is not None:
            self.cost = (self.cost or 0.0) + result.cost_usd
        self.attempts = max(self.attempts, result.attempts)
        self.cached = self.cached and result.cached
        self.latency = max(self.latency, result.latency)
        self.deployment = self.deployment or result.deployment
        self.key = self.key or result.key
        return self.left == 0

    @property
    def ok(self) -> bool:
        return self.error is None and all(v is not None for v in self.vectors)

    def outcome(self) -> Result:
        """The line as a Result, for the progress counters and the fail-fast check."""
        return Result(
            None,
            error=self.error,
            usage=Usage(input_tokens=self.tokens),
            attempts=self.attempts,
            deployment=self.deployment,
            cached=self.cached,
            cost_usd=self.cost,
        )

    def record(self) -> dict[str, Any]:
        item = self.item
        embedding = item.embedding
        record: dict[str, Any] = {"line": item.line, "id": item.custom_id or _id(embedding, self.key, item.line)}
        if item.custom_id is not None:
            record["custom_id"] = item.custom_id
        record["ok"] = self.ok
        record["embedding"] = _vectors_json(embedding, self.vectors) if self.ok else None
        record["error"] = error_record(self.error) if self.error is not None else None
        record["usage"] = usage_record(Usage(input_tokens=self.tokens))
        record["cost_usd"] = self.cost
        record["attempts"] = self.attempts
        record["latency_s"] = round(self.latency, 4)
        record["deployment"] = self.deployment
        record["cached"] = self.cached
        if embedding is not None:
            record["request_hash"] = embedding_hash(embedding)
        record["metadata"] = dict(embedding.metadata) if embedding is not None else {}
        return record


def _id(embedding: EmbeddingInput | None, key: str | None, line: int) -> str:
    if embedding is not None and embedding.id is not None:
        return embedding.id
    return key if key is not None else f"line-{line}"


def _vectors_json(embedding: EmbeddingInput | None, vectors: list[array[float] | None]) -> Any:
    encode = _base64 if embedding is not None and embedding.base64 else _numbers
    shown = [encode(v) for v in vectors if v is not None]
    return shown[0] if embedding is None or embedding.single else shown


def _numbers(vector: array[float]) -> list[float]:
    return vector.tolist()


def _base64(vector: array[float]) -> str:
    """As OpenAI sends ``encoding_format: "base64"``: float32 little-endian bytes."""
    if sys.byteorder != "little":  # pragma: no cover
        vector = array("f", vector)
        vector.byteswap()
    return base64.b64encode(vector.tobytes()).decode()


async def stream_embeddings(
    spec: JobSpec,
    progress: JobProgress,
    store: SqliteStore,
    done: DoneLines,
    on_tick: Callable[[], None],
    file: OutputFile,
) -> None:
    """Run the job's lines not yet in the output; every record is written as its line completes."""
    engine = engine_for(spec, progress, store)
    owners: dict[int, tuple[EmbedLine, int]] = {}
    numbering = itertools.count()

    def items() -> Iterator[EmbedItem]:
        for item in read_inputs(spec.input, spec.inputs):
            if item.line in done:
                continue
            if item.error is not None and spec.strict:
                progress.strict_error = item.error.message
                return  # the records before it still finish
            if item.own_model is not None:
                progress.note_own_model(item.own_model)
            texts: list[str | SluiceError]
            embed = _NO_SPEC
            if item.error is not None:
                texts = [item.error]
            elif item.embedding is None:
                texts = [InvalidInputError(f"line {item.line}: {CHAT_IN_EMBEDDING_JOB}", line=item.line)]
            else:
                try:
                    embed = EmbedSpec(item.embedding.model, item.embedding.params)
                    texts = list(item.embedding.texts)
                except SluiceError as exc:
                    texts = [InvalidInputError(f"line {item.line}: {exc.message}", line=item.line)]
            line = EmbedLine(item, len(texts))
            scope = None if spec.cache else f"line-{item.line}"  # --no-cache: no sharing between lines
            for position, text in enumerate(texts):
                owners[next(numbering)] = (line, position)
                yield EmbedItem(text, embed, scope)
        progress.source_exhausted = True

    pipeline = EmbedPipeline(engine.attempts, priority=Priority.BATCH, ordered=spec.ordered)
    output = JobOutput(file, progress)
    async with running(engine, store, output, progress, on_tick) as watch:
        async for result in pipeline.results(items()):
            line, position = owners.pop(result.index)
            if not line.add(position, result):
                continue
            if line.cancelled:
                progress.not_done += 1  # not written: the rerun does it
                continue
            if not output.write(line.record()):
                continue
            outcome = line.outcome()
            progress.count(outcome)
            watch(outcome)
