"""``/v1/files``: upload, list, retrieve, content, delete, as OpenAI's Files API does.

An upload is streamed to disk a chunk at a time (a 100 MB file never sits in memory) and
refused past :class:`~._ctx.Limits.max_file_bytes`, within the client's quotas, its
uploads under way and the upload deadline (``_uploads``). Only ``purpose="batch"`` is
taken: the one purpose the server uses. Its requests are counted off the event loop;
whether each line is a valid Batch request (``custom_id``, ``method``, ``url``, ``body``)
is decided when a batch is made of it (``batches._check``), as OpenAI does. Files expire
(``file_ttl_days``, or the upload's sooner ``expires_after[seconds]``; ``_expiry``).

Files belong to the client that uploaded them; another client gets a 404, as for a file
that does not exist. Output and error files of batches are files too
(``purpose="batch_output"``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from aiohttp import BodyPartReader, web

from ..core._body import BodyTimeout, timed_out, within_body_timeout
from ..core._errors import openai_error
from ..core._replicas import LIST_CAP, REPLICAS, is_forwarded, merged_page
from ._ctx import BATCH_CTX, BatchContext, caller, new_id, query_int
from ._db import INTERNAL_PURPOSES, FileRow
from ._uploads import UPLOAD_PREFIX, TooLarge, Upload, UploadRefused, record, write_chunks

__all__ = ["add_file_routes", "count_requests"]

#: Purposes a client may upload: those the server uses (``batch_output`` is written by batches only).
_PURPOSES = ("batch",)
_CHUNK = 1 << 16
#: After refusing an oversized upload, read (and drop) up to this much more of it, so the
#: client gets the 400 instead of a connection reset mid-send (which SDKs retry).
_DRAIN_BYTES = 64 * 1024 * 1024
#: ``expires_after[seconds]`` as OpenAI takes it: an hour to 30 days.
_EXPIRES_AFTER = (3600, 30 * 24 * 3600)


def add_file_routes(app: web.Application) -> None:
    app.router.add_post("/v1/files", create_file)
    app.router.add_get("/v1/files", list_files)
    app.router.add_get("/v1/files/{file_id}", retrieve_file)
    app.router.add_delete("/v1/files/{file_id}", delete_file)
    app.router.add_get("/v1/files/{file_id}/content", file_content)


class _Refused(Exception):
    def __init__(self, response: web.Response) -> None:
        self.response = response


@dataclass(slots=True)
class _Form:
    purpose: str | None = None
    filename: str | None = None
    size: int = 0
    expires_after: int | None = None


async def create_file(request: web.Request) -> web.StreamResponse:
    ctx = request.app[BATCH_CTX]
    client = caller(request)
    if not request.content_type.startswith("multipart/"):
        return openai_error(400, "upload the file as multipart/form-data with fields 'file' and 'purpose'")
    ctx.files_dir.mkdir(parents=True, exist_ok=True)
    upload = ctx.files_dir / f"{UPLOAD_PREFIX}{new_id('', 8)}"
    try:
        with ctx.uploads.begin(client.name, ctx.db) as under_way:
            form = await within_body_timeout(
                request, _receive(request, ctx, upload, under_way), total=ctx.limits.upload_timeout_s
            )
            if form.purpose is None:
                return openai_error(400, "missing required parameter: 'purpose'", param="purpose")
            if form.filename is None:
                return openai_error(400, "missing required parameter: 'file'", param="file")
            _check_purpose(form.purpose)
            lines = await asyncio.to_thread(count_requests, upload)
            now = int(time.time())
            row = FileRow(new_id("file-"), client.name, form.filename, form.purpose, form.size, now, lines)
            if form.expires_after is not None:  # the client's, when sooner than the server's
                ttl = ctx.db.file_ttl_s or form.expires_after
                row = dataclasses.replace(row, expires_at=now + min(form.expires_after, ttl))
            row = record(ctx.db, row, upload, ctx.file_path(row.id), under_way)
        replicas = request.app.get(REPLICAS)
        if replicas is not None:
            await replicas.own([row.id], client.name)
        return web.json_response(row.to_openai())
    except _Refused as refused:
        return refused.response
    except UploadRefused as refused:
        return _refusal(refused)
    except BodyTimeout as exc:
        return timed_out(request, exc)
    finally:
        with contextlib.suppress(FileNotFoundError):
            upload.unlink()


def _refusal(refused: UploadRefused) -> web.Response:
    headers = {"Retry-After": str(refused.retry_after)} if refused.retry_after is not None else None
    kind = "server_error" if refused.status >= 500 else "invalid_request_error"
    response = openai_error(refused.status, refused.message, code=refused.code, type=kind, headers=headers)
    response.force_close()  # the body may be unread
    return response


def _check_purpose(purpose: str) -> None:
    if purpose not in _PURPOSES:
        allowed = ", ".join(repr(p) for p in _PURPOSES)
        raise _Refused(
            openai_error(
                400, f"invalid purpose {purpose[:40]!r}; this server takes files of purpose {allowed}", param="purpose"
            )
        )


async def _receive(request: web.Request, ctx: BatchContext, upload: Path, under_way: Upload) -> _Form:
    """Read the form: ``purpose`` and ``expires_after`` (small) and ``file`` (streamed into ``upload``)."""
    form = _Form()
    try:
        reader = await request.multipart()
        while (part := await reader.next()) is not None:
            if not isinstance(part, BodyPartReader):  # a nested multipart: not ours
                raise _Refused(openai_error(400, "nested multipart bodies are not supported"))
            if part.name == "purpose":
                form.purpose = (await _small(part, 256)).strip()
                _check_purpose(form.purpose)  # before the file is read, when it comes first
            elif part.name == "expires_after[seconds]":
                form.expires_after = _expires_after(await _small(part, 32))
            elif part.name == "file" and form.filename is None:
                form.filename = os.path.basename(part.filename or "") or "upload.jsonl"
                form.size = await _stream_to(part, upload, ctx.limits.max_file_bytes, under_way)
            else:
                await part.release()
    except ValueError as exc:  # a broken multipart body
        raise _Refused(openai_error(400, f"the multipart body cannot be read: {exc}")) from None
    return form


def _expires_after(text: str) -> int:
    low, high = _EXPIRES_AFTER
    seconds = text.strip()
    if not seconds.isdigit() or not low <= int(seconds) <= high:
        raise _Refused(
            openai_error(
                400,
                f"expires_after[seconds] must be a whole number of seconds from {low} to {high}, got {seconds[:20]!r}",
                param="expires_after",
            )
        )
    return int(seconds)


async def _small(part: BodyPartReader, cap: int) -> str:
    data = b""
    while chunk := await part.read_chunk(max(cap, 256)):  # aiohttp reads at least a boundary's length
        data += chunk
        if len(data) > cap:
            raise _Refused(openai_error(400, f"form field {part.name!r} is longer than {cap} bytes"))
    return data.decode("utf-8", "replace")


async def _stream_to(part: BodyPartReader, path: Path, limit: int, under_way: Upload) -> int:
    async def chunks() -> AsyncIterator[bytes]:
        while chunk := await part.read_chunk(_CHUNK):
            yield chunk

    try:
        return await write_chunks(chunks(), path, under_way, limit)
    except TooLarge as exc:
        await _drain(part, exc.size)
        raise _Refused(
            openai_error(
                400,
                f"the file is larger than this server's limit of {limit:,} bytes",
                param="file",
                code="file_too_large",
            )
        ) from None
    except UploadRefused as refused:
        if refused.status < 500:
            await _drain(part, under_way.size)
        raise


async def _drain(part: BodyPartReader, size: int) -> None:
    while size < _DRAIN_BYTES and (chunk := await part.read_chunk(_CHUNK)):
        size += len(chunk)


def count_requests(path: Path) -> int:
    """The non-blank lines of an upload: its requests, as ``request_counts.total`` counts
    them. Nothing more is checked here: as at OpenAI, a batch file is validated when a
    batch is made from it (``batches._check``), and a bad line fails that batch, not the upload.

    Read a piece at a time (a one-line 150 MB file is never in memory whole); runs in a
    thread: reading 200 MB would stall the event loop.
    """
    count = 0
    blank = True  # the line read so far
    with path.open("rb") as f:
        while piece := f.readline(_CHUNK):
            if blank and piece.strip(b" \t\r\n\xef\xbb\xbf"):
                blank = False
            if piece.endswith(b"\n"):
                count += not blank
                blank = True
    return count + (not blank)


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
