"""``sluice serve --redis``: a request for a file, batch or stored response that another
replica holds is answered by that replica (the registry and the forwarding itself:
:mod:`sluice.serve.core._replicas`). A middleware of the app, above the APIs: it asks the
Files and Batches state and the Responses store whether an object is held here.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable

from aiohttp import web

from .. import _json
from .core._body import BodyTimeout, read_body, read_json, timed_out
from .core._errors import openai_error
from .core._replicas import REPLICAS, is_forwarded
from .files._ctx import BATCH_CTX, caller
from .responses._db import RESPONSES_DB

__all__ = ["forward_middleware"]

_log = logging.getLogger("sluice.serve.replicas")

_OBJECT_PATH = re.compile(r"^/v1/(files|batches|messages/batches|responses)/([^/]+)(/.*)?$")
#: A create that names an object another replica may hold: its path -> the body's field.
_NAMED_IN_BODY = {"/v1/batches": ("input_file_id", "files"), "/v1/responses": ("previous_response_id", "responses")}
_WHAT = {"files": "file", "batches": "batch", "messages/batches": "batch", "responses": "response"}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


# -- the middleware ------------------------------------------------------------------------------


async def _held_here(request: web.Request, kind: str, client: str, object_id: str) -> bool:
    if kind == "responses":
        stored = request.app[RESPONSES_DB]
        return await asyncio.to_thread(stored.response, client, object_id) is not None
    db = request.app[BATCH_CTX].db
    return (db.file(client, object_id) if kind == "files" else db.batch(client, object_id)) is not None


@web.middleware
async def forward_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Send a request for an object held by another replica to that replica."""
    replicas = request.app.get(REPLICAS)
    if replicas is None or is_forwarded(request):
        return await handler(request)
    match = _OBJECT_PATH.match(request.path)
    body: bytes | None = None
    if match is not None:
        kind, object_id = match.group(1), match.group(2)
    elif request.path in _NAMED_IN_BODY and request.method == "POST":
        field, kind = _NAMED_IN_BODY[request.path]
        try:  # within the body limits and timeout; read once, the handler gets the same
            parsed = await read_json(request)
        except Exception:  # the handler says what is wrong with it
            return await handler(request)
        object_id = parsed.get(field) if isinstance(parsed, dict) else None
        if not isinstance(object_id, str):
            return await handler(request)
        body = _json.dumps(parsed)
    else:
        return await handler(request)
    client = caller(request).name
    if await _held_here(request, kind, client, object_id):
        return await handler(request)
    what = f"{_WHAT[kind]} {object_id[:80]}"
    try:
        owner = await replicas.owner(object_id)
    except Exception as exc:
        _log.warning("sluice serve: cannot look up who holds %s in Redis: %s", what, exc)
        return openai_error(
            503, f"cannot find which replica holds {what}: Redis does not answer; retry later", type="server_error"
        )
    if owner is None or owner.client != client or owner.replica == replicas.id:
        return await handler(request)  # nobody's, another client's, or ours and gone: the handler's 404
    if not owner.address:  # its replica does not beat: never guess where it went
        return openai_error(503, f"the replica that holds {what} is not reachable; retry later", type="server_error")
    if body is None and request.method not in ("GET", "HEAD"):
        try:
            body = await read_body(request)
        except BodyTimeout:
            return timed_out(request)
    return await replicas.forward(request, owner, body, what)
