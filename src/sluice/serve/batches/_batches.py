"""``/v1/batches`` (create, retrieve, list, cancel) and ``/v1/files``, run by sluice
(Anthropic's ``/v1/messages/batches`` runs on the same machinery, from its own package:
``serve/message_batches``, whose routes the app adds beside these).

Code written for OpenAI's Batch API runs unchanged against ``sluice serve``: upload a JSONL
file of requests (``purpose="batch"``), create a batch over it, poll it, download its
output and error files (of chat, embeddings or Responses requests). The batch is
executed by the app's engine at ``Priority.BATCH``, against whatever deployments it has,
under the calling client's budget, and it survives a restart of the server (see
``_run``).

:func:`setup_batch_api` adds the routes and the startup/cleanup hooks (``_runs``:
batches with work left resume at startup, and stop feeding new lines at cleanup).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web

from ...batch._inputs import InputOptions
from ..core._body import BodyTimeout, read_json, timed_out
from ..core._context import BadBody, Refused
from ..core._errors import openai_error
from ..core._keys import ClientLike
from ..core._replicas import LIST_CAP, REPLICAS, is_forwarded, merged_page
from ..files._ctx import (
    BATCH_CTX,
    CHAT,
    EMBEDDINGS,
    MESSAGES,
    RESPONSES,
    BatchContext,
    Limits,
    ModelCheck,
    batch_objects,
    caller,
    new_batch,
    new_id,
    query_int,
)
from ..files._db import INTERNAL_PURPOSES
from ..files._expiry import start_expiry, stop_expiry
from ..files._files import add_file_routes
from ._run import public
from ._runs import RUNS, Runs, cancel_run, live_copy, resume_batches, start_run, stop_batches

__all__ = ["Limits", "recent_batches", "setup_batch_api"]

_ENDPOINTS = (CHAT, EMBEDDINGS, RESPONSES)


def setup_batch_api(
    app: web.Application,
    *,
    client_named: Callable[[str], ClientLike | None] | None = None,
    resolve_model: ModelCheck | None = None,
    limits: Limits | None = None,
    grace: float = 20.0,
    validate_json: bool = False,
) -> None:
    """Serve ``/v1/files`` and ``/v1/batches`` from ``app[ENGINE]``, keeping state in
    ``app[STATE_DIR]``.

    ``client_named(name)`` gives the configured client of that name (None once it is no
    longer configured): a batch resumed at startup runs under its budget. Without it, a
    resumed batch of a named client waits until that client next calls the Batch API.
    ``resolve_model(client, model)``: the engine's name for the model a line asks for, or
    None when the client may not use it (the line fails with ``model_not_found``); without
    it, lines go to the engine with the model they name.
    ``limits``: upload limits (200 MB, 50,000 requests per batch file by default; a
    Message Batch, ``/v1/messages/batches``, 256 MB and 100,000 requests).
    ``grace``: seconds in-flight lines get to finish when the server stops.
    ``validate_json``: a line's ``response_format`` with a schema is validated and re-asked
    (``[serve] validate_json``); else it goes upstream untouched.
    """
    app[BATCH_CTX] = BatchContext(limits or Limits(), resolve_model, InputOptions(line_schemas=validate_json))
    app[RUNS] = Runs(client_named, grace)
    add_file_routes(app)
    app.router.add_post("/v1/batches", create_batch)
    app.router.add_get("/v1/batches", list_batches)
    app.router.add_get("/v1/batches/{batch_id}", retrieve_batch)
    app.router.add_post("/v1/batches/{batch_id}/cancel", cancel_batch)
    app.on_startup.append(resume_batches)
    app.on_startup.append(start_expiry)
    app.on_cleanup.append(stop_expiry)
    app.on_cleanup.append(stop_batches)


def recent_batches(app: web.Application, limit: int) -> list[tuple[str, dict[str, Any]]]:
    """(client, batch) of the newest batches of every client, with the live counts of those
    at work here (the dashboard's; empty before the app started)."""
    ctx = app.get(BATCH_CTX)
    runs = app[RUNS].by_id if RUNS in app else {}
    try:
        rows = ctx.db.recent(limit) if ctx is not None else []
    except RuntimeError:  # not started yet
        return []
    return [(client, public(runs[b["id"]].batch if b["id"] in runs else b)) for client, b in rows]


# -- handlers ----------------------------------------------------------------------------------


async def create_batch(request: web.Request) -> web.Response:
    ctx = request.app[BATCH_CTX]
    client = caller(request)
    try:
        body = await read_json(request)  # within the body timeout; orjson: a nesting bomb is a 400
    except BadBody as exc:
        return openai_error(400, exc.message)
    except Refused as exc:  # too large, or no room to read it now
        return exc.response
    except BodyTimeout:
        return timed_out(request)
    if not isinstance(body, dict):
        return openai_error(400, "the request body must be a JSON object")
    problem = _check_create(body)
    if problem is not None:
        return openai_error(400, problem[1], param=problem[0])
    file_id = body["input_file_id"]
    row = ctx.db.file(client.name, file_id)
    if row is None or row.purpose in INTERNAL_PURPOSES:
        return openai_error(404, f"No such File object: {file_id}", param="input_file_id")
    if row.purpose != "batch":
        message = f"{file_id} was uploaded with purpose {row.purpose!r}; a batch needs purpose 'batch'"
        return openai_error(400, message, param="input_file_id")
    batch = new_batch(new_id("batch_", 16), body["endpoint"], file_id, row.lines, body.get("metadata"))
    ctx.db.save_batch(client.name, batch)
    replicas = request.app.get(REPLICAS)
    if replicas is not None:  # before the client hears of it: any replica can then find it
        await replicas.own(batch_objects(batch["id"]), client.name)
    start_run(request.app, client, batch)
    return web.json_response(public(batch))


def _check_create(body: Mapping[str, Any]) -> tuple[str, str] | None:
    """(param, message) for the first thing wrong with a create request, else None."""
    if not isinstance(body.get("input_file_id"), str) or not body["input_file_id"]:
        return "input_file_id", "missing required parameter: 'input_file_id'"
    endpoint = body.get("endpoint")
    if endpoint not in _ENDPOINTS:
        return "endpoint", f"endpoint must be one of {', '.join(_ENDPOINTS)}, got {endpoint!r}"
    if body.get("completion_window") != "24h":
        return "completion_window", f"completion_window must be '24h', got {body.get('completion_window')!r}"
    metadata = body.get("metadata")
    if metadata is not None:
        if not isinstance(metadata, dict) or len(metadata) > 16:
            return "metadata", "metadata must be an object of at most 16 string pairs"
        for key, value in metadata.items():
            if not isinstance(value, str) or len(key) > 64 or len(value) > 512:
                return "metadata", "metadata keys must be strings of at most 64 characters, values at most 512"
    return None


def _live(request: web.Request, batch: dict[str, Any]) -> dict[str, Any]:
    return public(live_copy(request.app, batch))


def _own_batch(request: web.Request) -> dict[str, Any] | web.Response:
    batch_id = request.match_info["batch_id"]
    batch = request.app[BATCH_CTX].db.batch(caller(request).name, batch_id)
    if batch is None or batch["endpoint"] == MESSAGES:  # a Message Batch is Anthropic's API's alone
        return openai_error(404, f"No such Batch object: {batch_id}", param="batch_id")
    return batch


async def retrieve_batch(request: web.Request) -> web.Response:
    batch = _own_batch(request)
    return batch if isinstance(batch, web.Response) else web.json_response(_live(request, batch))


async def list_batches(request: web.Request) -> web.Response:
    client = caller(request)
    limit = query_int(request, "limit", 20, 1, 100)
    if isinstance(limit, str):
        return openai_error(400, limit, param="limit")
    db = request.app[BATCH_CTX].db
    replicas = request.app.get(REPLICAS)
    if replicas is not None:  # with --redis: this replica's batches and every live replica's
        items = [_live(request, batch) for batch in db.batches(client.name, after=None, limit=LIST_CAP)]
        if is_forwarded(request):  # another replica merges: all of ours, unpaged
            return web.json_response(
                {"object": "list", "data": items, "first_id": None, "last_id": None, "has_more": False}
            )
        items += await replicas.peer_lists(request)
        page, more = merged_page(items, after=request.query.get("after"), limit=limit, descending=True)
    else:
        rows = db.batches(client.name, after=request.query.get("after"), limit=limit + 1)
        page, more = [_live(request, batch) for batch in rows[:limit]], len(rows) > limit
    return web.json_response(
        {
            "object": "list",
            "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": more,
        }
    )


async def cancel_batch(request: web.Request) -> web.Response:
    batch = _own_batch(request)
    if isinstance(batch, web.Response):
        return batch
    cancelled = cancel_run(request.app, caller(request).name, batch)
    if isinstance(cancelled, str):
        return openai_error(409, f"cannot cancel batch {batch['id']}: it is {cancelled}", param="batch_id")
    return web.json_response(public(cancelled))
