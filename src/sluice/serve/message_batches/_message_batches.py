"""Anthropic's Message Batches on ``sluice serve``: ``/v1/messages/batches`` (create,
retrieve, list, cancel, results, delete), as the anthropic SDK's
``client.messages.batches`` calls them.

A Message Batch is not a runner of its own: its requests are written as an internal
Batch API file (lines ``{"custom_id", "method": "POST", "url": "/v1/messages", "body":
params}``, see ``_check``) and run as an internal batch over it, endpoint
``/v1/messages``, by ``batches._run``, so whatever serve's OpenAI batches promise holds for
it too: each line at batch priority under the client's budget, limits and models, a
Messages body as written to an Anthropic deployment and translated for any other (one a
chat deployment cannot be told errors alone), every result stored as it lands, so a
restart (``kill -9`` included) resumes without sending a finished request again, and a
cancel keeps what finished. When the batch ends its stored results are written as
Anthropic's results file; the MessageBatch object is a view of the internal batch
(``batches._message_shapes``).

A client sees only its own batches (another's id is a 404 ``not_found_error``); errors are
Anthropic's. Bounds are Anthropic's: 100,000 requests and 256 MB a batch (``Limits``),
and one request at most ``Limits.max_line_bytes`` (8 MB) here. The body is an upload
(``files._uploads``: the client's uploads under way, quota and deadline): streamed to disk,
then checked a request at a time, never parsed whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from ..._errors import StoreError
from ..batches._message_shapes import ENDED, message_batch, processing_status
from ..batches._output import write_failed_results
from ..batches._runs import cancel_run, live_copy, start_run
from ..core._body import BodyTimeout, timeout_message, within_body_timeout
from ..core._replicas import LIST_CAP, REPLICAS, is_forwarded
from ..files._ctx import BATCH_CTX, MESSAGES, batch_objects, caller, derived_id, new_batch, new_id
from ..files._db import FileRow
from ..files._uploads import UPLOAD_PREFIX, TooLarge, UploadRefused, is_full, no_room, record, write_chunks
from ..messages._anthropic import anthropic_error
from ._check import Refusal, write_requests

__all__ = ["ID_PREFIX", "add_message_batch_routes"]

#: A Message Batch's id begins so (an OpenAI batch's with ``batch_``).
ID_PREFIX = "msgbatch_"
_CHUNK = 1 << 16


def add_message_batch_routes(app: web.Application) -> None:
    app.router.add_post("/v1/messages/batches", create_message_batch)
    app.router.add_get("/v1/messages/batches", list_message_batches)
    app.router.add_get("/v1/messages/batches/{batch_id}", retrieve_message_batch)
    app.router.add_delete("/v1/messages/batches/{batch_id}", delete_message_batch)
    app.router.add_post("/v1/messages/batches/{batch_id}/cancel", cancel_message_batch)
    app.router.add_get("/v1/messages/batches/{batch_id}/results", message_batch_results)


async def create_message_batch(request: web.Request) -> web.Response:
    ctx = request.app[BATCH_CTX]
    client = caller(request)
    limits = ctx.limits
    ctx.files_dir.mkdir(parents=True, exist_ok=True)
    body = ctx.files_dir / f"{UPLOAD_PREFIX}{new_id('', 8)}"
    batch_id = new_id(ID_PREFIX, 12)
    file_id = derived_id("file-", batch_id, "requests")
    path = ctx.file_path(file_id)
    part = path.with_name(f"{UPLOAD_PREFIX}{file_id}")
    try:
        with ctx.uploads.begin(client.name, ctx.db) as under_way:
            # the body goes to disk as it arrives (a Message Batch is up to 256 MB: it is an
            # upload, not a request body to parse whole), then is read a request at a time
            await within_body_timeout(
                request,
                write_chunks(_chunks(request), body, under_way, limits.max_message_batch_bytes),
                total=limits.upload_timeout_s,
            )
            count = await asyncio.to_thread(
                write_requests,
                body,
                part,
                max_requests=limits.max_message_requests,
                max_line_bytes=limits.max_line_bytes,
                max_values=limits.max_values,
            )
            name = f"{batch_id}_requests.jsonl"
            row = FileRow(file_id, client.name, name, "message_batch", part.stat().st_size, int(time.time()), count)
            record(ctx.db, row, part, path, under_way)
        batch = new_batch(batch_id, MESSAGES, file_id, count)
        try:
            ctx.db.save_batch(client.name, batch)
        except StoreError:
            ctx.db.delete_file(client.name, file_id)
            path.unlink()
            raise UploadRefused(
                507, "the server could not record this Message Batch (its disk may be full); nothing of it was kept"
            ) from None
    except TooLarge:
        response = anthropic_error(
            413, f"a Message Batch may be at most {limits.max_message_batch_bytes:,} bytes on this server"
        )
        response.force_close()  # the rest of the body is not read
        return response
    except BodyTimeout as exc:
        response = anthropic_error(408, timeout_message(request, exc), kind="timeout_error")
        response.force_close()
        return response
    except Refusal as refused:
        return anthropic_error(refused.status, refused.message)
    except UploadRefused as refused:
        return _refusal(refused)
    except OSError as exc:  # writing its requests
        if not is_full(exc):
            raise
        return _refusal(no_room())
    finally:
        for leftover in (body, part):
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()
    replicas = request.app.get(REPLICAS)
    if replicas is not None:  # before the client hears of it: any replica can then find it
        await replicas.own(batch_objects(batch_id), client.name)
    start_run(request.app, client, batch)
    return web.json_response(message_batch(batch))


def _refusal(refused: UploadRefused) -> web.Response:
    headers = {"Retry-After": str(refused.retry_after)} if refused.retry_after is not None else None
    response = anthropic_error(refused.status, refused.message, headers=headers)
    response.force_close()  # the body may be unread
    return response


async def _chunks(request: web.Request) -> AsyncIterator[bytes]:
    while chunk := await request.content.read(_CHUNK):
        yield chunk


def _own(request: web.Request) -> dict[str, Any] | web.Response:
    """The caller's Message Batch named in the path (its live copy), or the 404."""
    batch_id = request.match_info["batch_id"]
    found = None
    if batch_id.startswith(ID_PREFIX):
        found = request.app[BATCH_CTX].db.batch(caller(request).name, batch_id)
    if found is None:
        return anthropic_error(404, f"No Message Batch with id {batch_id[:100]!r} was found")
    return live_copy(request.app, found)


async def retrieve_message_batch(request: web.Request) -> web.Response:
    batch = _own(request)
    return batch if isinstance(batch, web.Response) else web.json_response(message_batch(batch))


async def list_message_batches(request: web.Request) -> web.Response:
    """Newest first; ``after_id`` pages on, ``before_id`` back, ``limit`` 1 to 1000."""
    query = request.query
    raw_limit = query.get("limit", "20")
    if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= 1000:
        return anthropic_error(400, f"limit: Input should be an integer from 1 to 1000, got {raw_limit[:20]!r}")
    limit = int(raw_limit)
    after, before = query.get("after_id"), query.get("before_id")
    if after is not None and before is not None:
        return anthropic_error(400, "give after_id or before_id, not both")
    client = caller(request)
    db = request.app[BATCH_CTX].db
    replicas = request.app.get(REPLICAS)
    if replicas is not None:  # with --redis: this replica's batches and every live replica's
        mine = db.batches(client.name, after=None, limit=LIST_CAP, prefix=ID_PREFIX)
        items = [message_batch(live_copy(request.app, batch)) for batch in mine]
        if is_forwarded(request):  # another replica merges: all of ours, unpaged
            return web.json_response({"data": items, "has_more": False, "first_id": None, "last_id": None})
        items += await replicas.peer_lists(request)
        page, more = _page(items, after=after, before=before, limit=limit)
    else:
        rows = db.batches(client.name, after=after, before=before, limit=limit + 1, prefix=ID_PREFIX)
        kept = rows[-limit:] if before is not None else rows[:limit]
        page, more = [message_batch(live_copy(request.app, batch)) for batch in kept], len(rows) > limit
    return web.json_response(
        {
            "data": page,
            "has_more": more,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
        }
    )


def _page(
    items: list[dict[str, Any]], *, after: str | None, before: str | None, limit: int
) -> tuple[list[dict[str, Any]], bool]:
    """One page of a merged list (newest first, each batch once) and whether more follow
    in the direction it was asked for."""
    unique = {item["id"]: item for item in items}
    ordered = sorted(unique.values(), key=lambda item: (item["created_at"], item["id"]), reverse=True)
    ids = [item["id"] for item in ordered]
    if before is not None and before in ids:
        earlier = ordered[: ids.index(before)]
        return earlier[-limit:], len(earlier) > limit
    if after is not None and after in ids:
        ordered = ordered[ids.index(after) + 1 :]
    return ordered[:limit], len(ordered) > limit


async def cancel_message_batch(request: web.Request) -> web.Response:
    batch = _own(request)
    if isinstance(batch, web.Response):
        return batch
    cancelled = cancel_run(request.app, caller(request).name, batch)
    if isinstance(cancelled, str):
        said = "has ended" if cancelled in ENDED else "is writing its results"
        return anthropic_error(409, f"Message Batch {batch['id']} {said}; it can no longer be canceled")
    return web.json_response(message_batch(cancelled))


async def message_batch_results(request: web.Request) -> web.StreamResponse:
    """The results file (JSONL, a line per request), once the batch has ended."""
    batch = _own(request)
    if isinstance(batch, web.Response):
        return batch
    ctx = request.app[BATCH_CTX]
    status = processing_status(batch["status"])
    if status != "ended":
        return anthropic_error(
            409, f"Message Batch {batch['id']} is {status}; its results can be read once its processing has ended"
        )
    if batch.get("output_file_id") is None and batch["status"] == "failed":  # it could not run: say so per request
        errors = (batch.get("errors") or {}).get("data") or [{}]
        why = str(errors[0].get("message") or "the batch could not be run")
        client = caller(request).name
        batch["output_file_id"] = await asyncio.to_thread(write_failed_results, ctx, client, batch, why)
        ctx.db.save_batch(client, batch)
    path = ctx.file_path(str(batch.get("output_file_id")))
    if not path.is_file():
        return anthropic_error(404, f"the results of {batch['id']} are gone from this server's state")
    return web.FileResponse(path, headers={"Content-Type": "application/x-jsonl"})


async def delete_message_batch(request: web.Request) -> web.Response:
    """A Message Batch and its results, once it has ended (cancel one at work first)."""
    batch = _own(request)
    if isinstance(batch, web.Response):
        return batch
    if processing_status(batch["status"]) != "ended":
        return anthropic_error(
            409, f"Message Batch {batch['id']} is still being processed; cancel it, and delete it once it has ended"
        )
    ctx = request.app[BATCH_CTX]
    client = caller(request).name
    for file_id in (batch.get("input_file_id"), batch.get("output_file_id")):
        if isinstance(file_id, str):
            ctx.db.delete_file(client, file_id)
            with contextlib.suppress(FileNotFoundError):
                ctx.file_path(file_id).unlink()
    ctx.db.delete_batch(client, batch["id"])
    replicas = request.app.get(REPLICAS)
    if replicas is not None:
        await replicas.disown(batch["id"])
    return web.json_response({"id": batch["id"], "type": "message_batch_deleted"})
