"""``/v1/files``: upload, list, retrieve, content, delete, as OpenAI's Files API does.

An upload is streamed to disk a chunk at a time (a 100 MB file never sits in memory) and
refused past :class:`~._batch_ctx.Limits.max_file_bytes`. A ``purpose="batch"`` file is
then checked, off the event loop, to be JSONL: UTF-8, every non-blank line a JSON object,
no line over ``max_line_bytes``, at most ``max_requests`` lines. Whether each line is a
valid Batch request (``custom_id``, ``method``, ``url``, ``body``) is decided per line when
a batch runs it: a bad line becomes a line of the batch's error file, as OpenAI does.

Files belong to the client that uploaded them; another client gets a 404, as for a file
that does not exist. Output and error files of batches are files too
(``purpose="batch_output"``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path

from aiohttp import BodyPartReader, web

from ._batch_ctx import BATCH_CTX, BatchContext, caller, new_id, query_int
from ._batch_db import INTERNAL_PURPOSES, FileRow
from ._body import BodyTimeout, timed_out, within_body_timeout
from ._errors import openai_error
from ._replicas import LIST_CAP, REPLICAS, is_forwarded, merged_page

__all__ = ["add_file_routes", "count_requests"]

#: Purposes a client may upload (``batch_output`` is written by batches only).
_PURPOSES = ("batch", "assistants", "fine-tune", "vision", "user_data", "evals")
_CHUNK = 1 << 16
#: After refusing an oversized upload, read (and drop) up to this much more of it, so the
#: client gets the 400 instead of a connection reset mid-send (which SDKs retry).
_DRAIN_BYTES = 64 * 1024 * 1024


def add_file_routes(app: web.Application) -> None:
    app.router.add_post("/v1/files", create_file)
    app.router.add_get("/v1/files", list_files)
    app.router.add_get("/v1/files/{file_id}", retrieve_file)
    app.router.add_delete("/v1/files/{file_id}", delete_file)
    app.router.add_get("/v1/files/{file_id}/content", file_content)


class _Refused(Exception):
    def __init__(self, response: web.Response) -> None:
        self.response = response


async def create_file(request: web.Request) -> web.StreamResponse:
    ctx = request.app[BATCH_CTX]
    client = caller(request)
    if not request.content_type.startswith("multipart/"):
        return openai_error(400, "upload the file as multipart/form-data with fields 'file' and 'purpose'")
    ctx.files_dir.mkdir(parents=True, exist_ok=True)
    upload = ctx.files_dir / f".upload-{new_id('', 8)}"
    try:
        purpose, filename, size = await within_body_timeout(request, _receive(request, ctx, upload))
        if purpose is None:
            return openai_error(400, "missing required parameter: 'purpose'", param="purpose")
        if filename is None:
            return openai_error(400, "missing required parameter: 'file'", param="file")
        if purpose not in _PURPOSES:
            allowed = ", ".join(repr(p) for p in _PURPOSES)
            return openai_error(400, f"invalid purpose {purpose!r}; use one of {allowed}", param="purpose")
        lines = await asyncio.to_thread(count_requests, upload) if purpose == "batch" else 0
        row = FileRow(new_id("file-"), client.name, filename, purpose, size, int(time.time()), lines)
        upload.rename(ctx.file_path(row.id))
        ctx.db.add_file(row)
        replicas = request.app.get(REPLICAS)
        if replicas is not None:
            await replicas.own([row.id], client.name)
        return web.json_response(row.to_openai())
    except _Refused as refused:
        return refused.response
    except BodyTimeout:
        return timed_out(request)
    finally:
        with contextlib.suppress(FileNotFoundError):
            upload.unlink()


async def _receive(request: web.Request, ctx: BatchContext, upload: Path) -> tuple[str | None, str | None, int]:
    """Read the form: ``purpose`` (small) and ``file`` (streamed into ``upload``)."""
    limit = ctx.limits.max_file_bytes
    purpose: str | None = None
    filename: str | None = None
    size = 0
    try:
        reader = await request.multipart()
        while (part := await reader.next()) is not None:
            if not isinstance(part, BodyPartReader):  # a nested multipart: not ours
                raise _Refused(openai_error(400, "nested multipart bodies are not supported"))
            if part.name == "purpose":
                purpose = (await _small(part, 256)).strip()
            elif part.name == "file" and filename is None:
                filename = os.path.basename(part.filename or "") or "upload.jsonl"
                size = await _stream_to(part, upload, limit)
            else:
                await part.release()
    except ValueError as exc:  # a broken multipart body
        raise _Refused(openai_error(400, f"the multipart body cannot be read: {exc}")) from None
    return purpose, filename, size


async def _small(part: BodyPartReader, cap: int) -> str:
    data = b""
    while chunk := await part.read_chunk(cap):
        data += chunk
        if len(data) > cap:
            raise _Refused(openai_error(400, f"form field {part.name!r} is longer than {cap} bytes"))
    return data.decode("utf-8", "replace")


async def _stream_to(part: BodyPartReader, path: Path, limit: int) -> int:
    size = 0
    with path.open("wb") as out:
        while chunk := await part.read_chunk(_CHUNK):
            size += len(chunk)
            if size > limit:
                await _drain(part, size)
                raise _Refused(
                    openai_error(
                        400,
                        f"the file is larger than this server's limit of {limit:,} bytes",
                        param="file",
                        code="file_too_large",
                    )
                )
            out.write(chunk)
    return size


async def _drain(part: BodyPartReader, size: int) -> None:
    while size < _DRAIN_BYTES and (chunk := await part.read_chunk(_CHUNK)):
        size += len(chunk)


def count_requests(path: Path) -> int:
    """The non-blank lines of an upload: its requests, as ``request_counts.total`` counts
    them. Nothing more is checked here: as at OpenAI, a batch file is validated when a
    batch is made from it (``_batch_check``), and a bad line fails that batch, not the upload.

    Runs in a thread: reading 200 MB would stall the event loop.
    """
    count = 0
    with path.open("rb") as f:
        for raw in f:
            if raw.strip(b" \t\r\n\xef\xbb\xbf"):
                count += 1
    return count


async def list_files(request: web.Request) -> web.Response:
    ctx = request.app[BATCH_CTX]
    client = caller(request)
    limit = query_int(request, "limit", 10_000, 1, 10_000)
    if isinstance(limit, str):
        return openai_error(400, limit, param="limit")
    order = request.query.get("order", "desc")
    if order not in ("asc", "desc"):
        return openai_error(400, f"order must be 'asc' or 'desc', got {order!r}", param="order")
    replicas = request.app.get(REPLICAS)
    if replicas is not None:  # with --redis: this replica's files and every live replica's
        mine = ctx.db.files(
            client.name, purpose=request.query.get("purpose"), after=None, limit=LIST_CAP, descending=True
        )
        items = [row.to_openai() for row in mine]
        if is_forwarded(request):  # another replica merges: all of ours, unpaged
            return web.json_response(
                {"object": "list", "data": items, "first_id": None, "last_id": None, "has_more": False}
            )
        items += await replicas.peer_lists(request)
        data, more = merged_page(items, after=request.query.get("after"), limit=limit, descending=order == "desc")
    else:
        rows = ctx.db.files(
            client.name,
            purpose=request.query.get("purpose"),
            after=request.query.get("after"),
            limit=limit + 1,
            descending=order == "desc",
        )
        data, more = [row.to_openai() for row in rows[:limit]], len(rows) > limit
    return web.json_response(
        {
            "object": "list",
            "data": data,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
            "has_more": more,
        }
    )


def _own_file(request: web.Request) -> FileRow | web.Response:
    file_id = request.match_info["file_id"]
    row = request.app[BATCH_CTX].db.file(caller(request).name, file_id)
    if row is None or row.purpose in INTERNAL_PURPOSES:  # a Message Batch's own: not a file of the client's
        return openai_error(404, f"No such File object: {file_id}", param="id")
    return row


async def retrieve_file(request: web.Request) -> web.Response:
    row = _own_file(request)
    return row if isinstance(row, web.Response) else web.json_response(row.to_openai())


async def file_content(request: web.Request) -> web.StreamResponse:
    row = _own_file(request)
    if isinstance(row, web.Response):
        return row
    path = request.app[BATCH_CTX].file_path(row.id)
    if not path.is_file():
        return openai_error(404, f"the content of {row.id} is gone from this server's state", param="id")
    return web.FileResponse(path, headers={"Content-Type": "application/octet-stream"})


async def delete_file(request: web.Request) -> web.Response:
    ctx = request.app[BATCH_CTX]
    row = _own_file(request)
    if isinstance(row, web.Response):
        return row
    running = ctx.db.using(row.client, row.id)
    if running:
        return openai_error(
            409,
            f"{row.id} is the input of batch {running[0]}, which is still running; cancel it or wait for it to end",
            param="id",
        )
    ctx.db.delete_file(row.client, row.id)
    replicas = request.app.get(REPLICAS)
    if replicas is not None:
        await replicas.disown(row.id)
    with contextlib.suppress(FileNotFoundError):
        ctx.file_path(row.id).unlink()
    return web.json_response({"id": row.id, "object": "file", "deleted": True})
