"""A ``POST /v1/messages/batches`` body checked as Anthropic checks it, and written as the
batch's internal input file.

Anthropic refuses the whole batch, with a 400 naming the field, when it is not a list of
1 to 100,000 requests, each ``{"custom_id", "params"}`` with a ``custom_id`` of 1 to 64
characters of ``[a-zA-Z0-9_-]`` used once, and ``params`` a Messages body (checked by
:func:`~sluice.shapes.messages._in.chat_from_messages`, as ``POST /v1/messages`` checks
one; ``stream`` is not taken in a batch). Messages are Anthropic's (pydantic's) way of
saying it: ``requests.3.params.max_tokens: Field required``.

Each request becomes a Batch API line, ``{"custom_id", "method": "POST", "url":
"/v1/messages", "body": params}``, which ``batches._run`` runs as it runs any batch's.
Runs in a thread: 100,000 requests take seconds to check.

The body (up to 256 MB) is never parsed whole: :class:`~._json_items.JsonScan` reads it
from the file it was streamed to and hands over one request at a time, whose size and
values are checked before it is parsed. So a refusal names the first bad request; a body
that is not JSON further on is a 400 too, once the scan gets there.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ... import _json
from ...shapes._common import ShapeError
from ...shapes.messages._in import chat_from_messages
from ..files._ctx import MESSAGES
from ._json_items import ItemTooLarge, JsonScan, NotJson

__all__ = ["Refusal", "write_requests"]

_CUSTOM_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_PATTERN = "^[a-zA-Z0-9_-]{1,64}$"


class Refusal(Exception):
    """The batch is refused: the HTTP status and Anthropic's message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def write_requests(source: Path, path: Path, *, max_requests: int, max_line_bytes: int, max_values: int) -> int:
    """Check the body in ``source``, write its requests to ``path`` as Batch API lines; how
    many there are. Raises :class:`Refusal` (nothing is left at ``path`` then)."""
    try:
        with source.open("rb") as body, path.open("wb") as out:
            return _write(JsonScan(body), out, max_requests, max_line_bytes, max_values)
    except NotJson:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        raise Refusal(400, "the request body is not valid JSON") from None
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        raise


def _write(scan: JsonScan, out: Any, max_requests: int, max_line_bytes: int, max_values: int) -> int:
    if scan.peek() != b"{":
        raise Refusal(400, "the request body must be a JSON object")
    scan.take(b"{")
    count: int | None = None
    while scan.peek() != b"}":
        if count is not None:
            scan.take(b",")
        key = scan.key()
        if key != "requests":
            raise Refusal(400, f"{key[:64]}: Extra inputs are not permitted")
        if count is not None:
            raise Refusal(400, "requests: given twice; give the list once")
        if scan.peek() != b"[":
            raise Refusal(400, "requests: Input should be a valid list")
        count = _write_items(scan, out, max_requests, max_line_bytes, max_values)
    scan.take(b"}")
    if scan.peek():
        raise NotJson("more after the object")
    if count is None:
        raise Refusal(400, "requests: Field required")
    if not count:
        raise Refusal(400, "requests: List should have at least 1 item after validation, not 0")
    return count


def _write_items(scan: JsonScan, out: Any, max_requests: int, max_line_bytes: int, max_values: int) -> int:
    seen: dict[str, int] = {}
    index = -1
    items = scan.items(max_line_bytes)
    while True:
        where = f"requests.{index + 1}"
        try:
            raw = next(items, None)
        except ItemTooLarge:
            raise Refusal(
                413, f"{where}: one request of a Message Batch may be at most {max_line_bytes:,} bytes on this server"
            ) from None
        if raw is None:
            return index + 1
        index += 1
        if index >= max_requests:
            raise Refusal(400, f"requests: List should have at most {max_requests} items after validation, not more")
        if _json.most_values(raw) > max_values:
            raise Refusal(
                413,
                f"{where}: this request holds more than {max_values:,} JSON values and keys; "
                "this server parses at most that many in one request",
            )
        try:
            request = _json.loads(raw)
        except ValueError:
            raise NotJson(where) from None
        custom_id, params = _request(request, where, seen)
        seen[custom_id] = index
        line = _json.dumps({"custom_id": custom_id, "method": "POST", "url": MESSAGES, "body": params}) + b"\n"
        if len(line) > max_line_bytes:
            raise Refusal(
                413,
                f"{where}: this request is {len(line):,} bytes; one request of a Message Batch "
                f"may be at most {max_line_bytes:,} bytes on this server",
            )
        out.write(line)


def _request(request: Any, where: str, seen: Mapping[str, int]) -> tuple[str, Mapping[str, Any]]:
    if not isinstance(request, Mapping):
        raise Refusal(400, f"{where}: Input should be a valid dictionary")
    _no_extras(request, ("custom_id", "params"), f"{where}.")
    custom_id = request.get("custom_id")
    if custom_id is None:
        raise Refusal(400, f"{where}.custom_id: Field required")
    if not isinstance(custom_id, str):
        raise Refusal(400, f"{where}.custom_id: Input should be a valid string")
    if not _CUSTOM_ID.match(custom_id):
        raise Refusal(400, f"{where}.custom_id: String should match pattern '{_PATTERN}'")
    if custom_id in seen:
        raise Refusal(
            400,
            f"{where}.custom_id: {custom_id!r} is the custom_id of requests.{seen[custom_id]} too; "
            "each request in a Message Batch needs its own",
        )
    params = request.get("params")
    if params is None:
        raise Refusal(400, f"{where}.params: Field required")
    if not isinstance(params, Mapping):
        raise Refusal(400, f"{where}.params: Input should be a valid dictionary")
    if params.get("stream"):
        raise Refusal(400, f"{where}.params.stream: streaming is not supported in a Message Batch; remove it")
    try:
        chat_from_messages(params)
    except ShapeError as exc:
        field = exc.message if exc.param and exc.message.startswith(exc.param) else f": {exc.message}"
        raise Refusal(400, f"{where}.params{'.' if field[0] != ':' else ''}{field}") from None
    return custom_id, params


def _no_extras(obj: Mapping[str, Any], allowed: tuple[str, ...], where: str) -> None:
    for key in obj:
        if key not in allowed:
            raise Refusal(400, f"{where}{str(key)[:64]}: Extra inputs are not permitted")
