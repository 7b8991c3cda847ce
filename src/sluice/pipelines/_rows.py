"""A row in, its answer's columns out: the same for every engine.

A row carries ``messages`` (a list of chat messages), ``body`` (a Chat Completions body, as
in a Batch API line) or ``prompt`` (text), and may carry ``custom_id`` (its id: two rows
with the same content and no id share one answer). Each becomes a Request as a line of a
``sluice run`` file does (:func:`sluice.batch._inputs.record_item`), so a row fails
alone, with an ``invalid_input`` error that says what is wrong. Embeddings rows carry
their text in one column (``text`` unless ``text_column=`` says otherwise).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import Any

from .._embeddings import EmbeddingResult
from .._errors import InvalidInputError, SluiceError
from .._models import Request, Result, seal
from ..batch._inputs import InputOptions, record_item
from ..structured import Schema
from ._job import RowJob

__all__ = ["CHAT_COLUMNS", "EMBEDDING_COLUMNS", "RowReader", "chat_columns", "embedding_columns"]

#: The columns an answer adds to its row (``parsed`` too, with a schema).
CHAT_COLUMNS = ("ok", "text", "error_type", "error", "cost_usd", "attempts", "deployment", "cached")
EMBEDDING_COLUMNS = ("vector", "ok", "error_type", "error", "cost_usd", "attempts", "deployment", "cached")

_ASKING = ("messages", "body", "prompt")


class RowReader:
    """Rows as requests, with the job's model, ``max_tokens``, schema and system prompt."""

    def __init__(self, job: RowJob, model: str | None) -> None:
        self.job = job
        self.model = model

    @cached_property
    def schema(self) -> Schema | None:
        return Schema.of(self.job.schema) if self.job.schema is not None else None

    @cached_property
    def options(self) -> InputOptions:
        job = self.job
        return InputOptions(
            model=self.model,
            max_tokens=job.max_tokens,
            temperature=job.temperature,
            system=job.system,
            schema=self.schema,
        )

    def request(self, row: Mapping[str, Any], index: int) -> Request | SluiceError:
        """The row's request, sealed (its store key worked out once), or why it cannot be one."""
        custom_id = row.get("custom_id")
        where = f"row {index} of its batch" if custom_id is None else f"row custom_id={custom_id!r}"
        if custom_id is not None and not isinstance(custom_id, str):
            return InvalidInputError(f"{where}: custom_id must be a string, got {type(custom_id).__name__}", line=index)
        asking = [name for name in _ASKING if row.get(name) is not None]
        if len(asking) != 1:
            have = ", ".join(str(k) for k in row) or "none"
            said = f"a value in each of {asking}" if asking else "no value in 'messages', 'body' or 'prompt'"
            return InvalidInputError(
                f"{where}: {said}; exactly one of them asks the question (columns: {have})", line=index
            )
        value = row[asking[0]]
        record: dict[str, Any]
        if asking[0] == "body":
            if not isinstance(value, dict):
                return InvalidInputError(f"{where}: body must be a JSON object (a dict)", line=index)
            # Arrow's struct columns give every row every field: a null one is not the row's
            value = {k: v for k, v in value.items() if v is not None}
            record = {"custom_id": custom_id, "body": value} if custom_id else value
        elif asking[0] == "messages":
            record = {"messages": value}
        else:
            if not isinstance(value, str):
                return InvalidInputError(f"{where}: prompt must be text, got {type(value).__name__}", line=index)
            record = {"messages": [{"role": "user", "content": value}]}
        if custom_id and asking[0] != "body":
            record["id"] = custom_id
        item = record_item(record, index, where, self.options)
        if item.error is not None:
            return item.error
        if item.request is None:
            return InvalidInputError(f"{where}: an embeddings body; use sluice's Embeddings for those", line=index)
        return seal(item.request)

    def text(self, row: Mapping[str, Any], index: int) -> str | SluiceError:
        """An embeddings row's text."""
        column = self.job.text_column
        value = row.get(column)
        if not isinstance(value, str) or not value:
            have = ", ".join(str(k) for k in row) or "none"
            return InvalidInputError(
                f"row {index} of its batch: no text in column {column!r} to embed (columns: {have})", line=index
            )
        return value


def _error_columns(error: SluiceError | None) -> tuple[str | None, str | None]:
    return (error.kind, error.message) if error is not None else (None, None)


def chat_columns(results: Sequence[Result], schema: Schema | None) -> dict[str, list[Any]]:
    """The answer columns of a batch, in row order."""
    columns: dict[str, list[Any]] = {name: [] for name in CHAT_COLUMNS}
    parsed: list[Any] = []
    for result in results:
        error_type, error = _error_columns(result.error)
        values = (
            result.ok,
            result.text,
            error_type,
            error,
            result.cost_usd,
            result.attempts,
            result.deployment,
            result.cached,
        )
        for name, value in zip(CHAT_COLUMNS, values, strict=True):
            columns[name].append(value)
        if schema is not None:
            parsed.append(schema.to_json(result.parsed) if result.ok else None)
    if schema is not None:
        columns["parsed"] = parsed
    return columns


def embedding_columns(results: Sequence[EmbeddingResult | SluiceError]) -> dict[str, list[Any]]:
    """The columns of a batch of embeddings: ``vector`` a float32 numpy array (a list of
    floats without numpy), None for a row that failed."""
    numpy: Any
    try:
        import numpy
    except ImportError:  # pragma: no cover - every engine here brings numpy
        numpy = None
    columns: dict[str, list[Any]] = {name: [] for name in EMBEDDING_COLUMNS}
    for result in results:
        if isinstance(result, SluiceError):
            values: tuple[Any, ...] = (None, False, result.kind, result.message, None, 0, None, False)
        else:
            vector: Any = result.vector
            if vector is not None:
                vector = numpy.frombuffer(vector, dtype=numpy.float32).copy() if numpy is not None else list(vector)
            error_type, error = _error_columns(result.error)
            values = (
                vector,
                result.ok,
                error_type,
                error,
                result.cost_usd,
                result.attempts,
                result.deployment,
                result.cached,
            )
        for name, value in zip(EMBEDDING_COLUMNS, values, strict=True):
            columns[name].append(value)
    return columns
