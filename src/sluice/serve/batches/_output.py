"""A finished batch's files, written from its per-line results, in input order.

An OpenAI batch gets an output file (the answered lines) and an error file (the rest), in
OpenAI's shape (:mod:`._shapes`): a chat line's body is its chat.completion, an
embeddings line's its list of vectors, a Responses line's a Response. A Message Batch
gets one results file of Anthropic's lines instead (:mod:`._message_shapes`),
kept for the batch alone (``purpose="message_batch_results"``, never listed by
``/v1/files``).

Runs in a thread (files may be large). The files' ids derive from the batch's, so a
finalize redone after a crash replaces them instead of leaving orphans.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ... import _json
from ..._models import Usage
from ...batch._inputs import InputItem, read_inputs
from ...store import SqliteStore
from ..files._ctx import EMBEDDINGS, MESSAGES, RESPONSES, BatchContext, derived_id
from ..files._db import FileRow
from ._message_shapes import errored_result, result_line
from ._shapes import Scrubber, chat_body, error_line, not_run_line, output_line, response_body, usage_of

__all__ = ["Made", "line_key", "write_failed_results", "write_outputs"]


@dataclass(frozen=True, slots=True)
class Made:
    """The files written (ids, None for one with no lines) and what they hold."""

    output: str | None
    errors: str | None
    completed: int
    failed: int
    usage: Usage


def line_key(line: int) -> str:
    """A line's key in the batch's own store."""
    return f"line-{line}"


def write_outputs(
    ctx: BatchContext, client: str, batch: dict[str, Any], lines: Path, final: str, scrub: Scrubber
) -> Made:
    """The batch's files from ``lines`` (its store); ``final``: how it ended."""
    store = SqliteStore(lines)
    try:
        if batch["endpoint"] == MESSAGES:
            return _results(ctx, client, batch, store, final, scrub)
        return _openai_files(ctx, client, batch, store, final, scrub)
    finally:
        store.close()


def _items(ctx: BatchContext, batch: dict[str, Any]) -> Iterator[InputItem]:
    return read_inputs(ctx.file_path(batch["input_file_id"]), ctx.inputs)


def _openai_files(
    ctx: BatchContext, client: str, batch: dict[str, Any], store: SqliteStore, final: str, scrub: Scrubber
) -> Made:
    batch_id, endpoint = batch["id"], batch["endpoint"]
    names = {"output": f"{batch_id}_output.jsonl", "errors": f"{batch_id}_error.jsonl"}
    ids = {kind: derived_id("file-", batch_id, kind) for kind in names}
    paths = {kind: ctx.file_path(ids[kind]).with_suffix(".part") for kind in names}
    written = {"output": 0, "errors": 0}
    never = 0
    usage = Usage()
    with paths["output"].open("wb") as out, paths["errors"].open("wb") as err:
        for item in _items(ctx, batch):
            stored = store.get(line_key(item.line))
            if stored is None:
                line = not_run_line(batch_id, item.line, item.custom_id, final)
                never += 1
            elif stored.ok:
                record = stored.record
                usage = usage + usage_of(record)
                if endpoint == EMBEDDINGS:
                    body = record["raw"]
                elif endpoint == RESPONSES and item.request is not None and item.request.native is not None:
                    answer_id = derived_id("resp_", batch_id, str(item.line), nbytes=16)
                    body = response_body(record, item.request.native.body, answer_id)
                else:
                    body = chat_body(record)
                line = output_line(batch_id, item.line, item.custom_id, body, record.get("request_id"))
            else:
                line = error_line(batch_id, item.line, item.custom_id, stored.record.get("error") or {}, scrub)
            kind = "output" if line["error"] is None else "errors"
            (out if kind == "output" else err).write(_json.dumps(line) + b"\n")
            written[kind] += 1
    made = {
        kind: _keep(ctx, client, ids[kind], name, paths[kind], written[kind], "batch_output")
        for kind, name in names.items()
    }
    return Made(made["output"], made["errors"], written["output"], written["errors"] - never, usage)


def _results(
    ctx: BatchContext, client: str, batch: dict[str, Any], store: SqliteStore, final: str, scrub: Scrubber
) -> Made:
    """A Message Batch's results file: one Anthropic line per request."""
    file_id = derived_id("file-", batch["id"], "results")
    path = ctx.file_path(file_id).with_suffix(".part")
    counts = {"succeeded": 0, "errored": 0, "lines": 0}
    usage = Usage()
    with path.open("wb") as out:
        for item in _items(ctx, batch):
            stored = store.get(line_key(item.line))
            if stored is not None and stored.ok:
                usage = usage + usage_of(stored.record)
                counts["succeeded"] += 1
            elif stored is not None:
                counts["errored"] += 1
            record = stored.record if stored is not None else None
            line = result_line(
                item.custom_id, record, stored is not None and stored.ok, model=_model(item), final=final, scrub=scrub
            )
            out.write(_json.dumps(line) + b"\n")
            counts["lines"] += 1
    kept = _keep(ctx, client, file_id, f"{batch['id']}_results.jsonl", path, counts["lines"], "message_batch_results")
    return Made(kept, None, counts["succeeded"], counts["errored"], usage)


def write_failed_results(ctx: BatchContext, client: str, batch: dict[str, Any], message: str) -> str:
    """The results file of a Message Batch that could not run at all: every request
    errored, with why (its id; the batch's ``output_file_id`` is then set to it)."""
    file_id = derived_id("file-", batch["id"], "results")
    path = ctx.file_path(file_id).with_suffix(".part")
    lines = 0
    with path.open("wb") as out:
        for item in _items(ctx, batch):
            line = {"custom_id": item.custom_id, "result": errored_result("api_error", message)}
            out.write(_json.dumps(line) + b"\n")
            lines += 1
    kept = _keep(ctx, client, file_id, f"{batch['id']}_results.jsonl", path, max(lines, 1), "message_batch_results")
    assert kept is not None
    return kept


def _model(item: InputItem) -> str:
    """The model a Messages line named (the answer names the one the client asked for)."""
    request = item.request
    if request is None:
        return ""
    native = request.native.body.get("model") if request.native is not None else None
    return native if isinstance(native, str) else request.model


def _keep(ctx: BatchContext, client: str, file_id: str, name: str, part: Path, lines: int, purpose: str) -> str | None:
    """A written ``.part`` file in its place and on record; None (and gone) when empty."""
    if not lines:
        part.unlink()
        return None
    size = part.stat().st_size
    part.replace(ctx.file_path(file_id))
    ctx.db.add_file(FileRow(file_id, client, name, purpose, size, int(time.time()), lines))
    return file_id
