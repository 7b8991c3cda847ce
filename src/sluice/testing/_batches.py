"""The fake's Batch APIs: OpenAI's Files + Batches and Anthropic's Message Batches.

Written from the providers' documentation, not from sluice's client: a batch is taken,
validated (a line that is not a request fails the whole batch, as OpenAI does), waits
``start_after`` seconds, then answers ``lines_per_second`` lines a second (all at once
when None) and finalizes; ``expire_after`` seconds after creation an unfinished batch
expires with its finished lines kept; a cancel stops it between lines. Every answered
line is billed once at ``discount`` times the model's price (ledger ``tier="batch"``);
a line answered by two batches, or by a batch and a synchronous request with the same
key, counts in ``ServerStats.duplicate_successes``. Batches and files are visible only
to the key that made them.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiohttp import BodyPartReader, web

from ._formats import AnthropicFormat, ApiError, Call, ErrorKind, Format, OpenAIFormat, dumps, loads
from ._responses import ResponsesFormat
from ._structured import render

if TYPE_CHECKING:
    from ._server import FakeServer

__all__ = ["BatchDesk"]

_JSON = "application/json"
_ENDPOINTS = ("/v1/chat/completions", "/v1/embeddings", "/v1/responses")
_OPEN = ("validating", "in_progress", "finalizing", "cancelling")


@dataclass(slots=True)
class _File:
    id: str
    owner: str
    purpose: str
    filename: str
    content: bytes
    created_at: int

    def public(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "file",
            "bytes": len(self.content),
            "created_at": self.created_at,
            "filename": self.filename,
            "purpose": self.purpose,
        }


@dataclass(slots=True)
class _Line:
    custom_id: str
    body: Any
    call: Call | None = None
    problem: ApiError | None = None


@dataclass(slots=True)
class _Batch:
    id: str
    owner: str
    anthropic: bool
    endpoint: str
    input_file_id: str | None
    metadata: dict[str, str]
    created_at: float
    expires_at: float
    lines: list[_Line] = field(default_factory=list)
    status: str = "validating"
    errors: list[dict[str, Any]] | None = None
    done: dict[str, bytes] = field(default_factory=dict)  # custom_id -> output line
    failed: dict[str, bytes] = field(default_factory=dict)  # custom_id -> error line
    stamps: dict[str, float] = field(default_factory=dict)
    output_file_id: str | None = None
    error_file_id: str | None = None
    cancel: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None

    @property
    def tokens(self) -> int:
        return sum(line.call.prompt_tokens + line.call.max_tokens for line in self.lines if line.call is not None)


class BatchDesk:
    """Files and batches of one :class:`FakeServer` (``server.batches``); its settings may
    be changed while it runs."""

    def __init__(self, server: FakeServer) -> None:
        self._server = server
        #: Seconds a batch waits (validating) before it starts; ``math.inf``: it never starts.
        self.start_after = 0.0
        #: Lines answered per second once started; None answers them all at once.
        self.lines_per_second: float | None = None
        #: Seconds from creation until an unfinished batch expires (the completion window).
        self.expire_after = 24 * 3600.0
        #: Tokens (prompt + max_tokens) of open batches per key and model beyond which a new
        #: one fails with ``token_limit_exceeded``; None: no limit.
        self.enqueued_token_limit: int | None = None
        #: Share of the synchronous price a batch line is billed.
        self.discount = 0.5
        #: Called with a batch's public form right after it is created, before the reply
        #: goes out (a test kills the client there: the batch exists, unrecorded).
        self.on_created: Callable[[Mapping[str, Any]], None] | None = None
        #: Called with ``"METHOD /path"`` as each Files or Batches request arrives (a test
        #: kills the client at a chosen step of its protocol).
        self.on_request: Callable[[str], None] | None = None
        #: Says why a line's body is refused as the request's own fault (a 400 in the
        #: batch's error file), or None to answer it.
        self.reject: Callable[[Mapping[str, Any]], str | None] | None = None
        self.files: dict[str, _File] = {}
        self.batches: dict[str, _Batch] = {}
        self._line_faults: list[int] = []
        self._call_faults: list[tuple[str, int, bool]] = []
        self._ids = itertools.count(1)

    # -- for tests -----------------------------------------------------------------------

    def fail_calls(self, prefix: str, times: int = 1, *, status: int = 500, after: bool = False) -> None:
        """The next ``times`` Batch API calls whose ``"METHOD /path"`` starts with ``prefix``
        get ``status``: before anything is done, or (``after``) once the call has taken
        effect, as a reply lost on the way (a batch created, its id never received)."""
        self._call_faults.extend([(prefix, status, after)] * times)

    def fail_lines(self, times: int = 1, status: int = 500) -> None:
        """The next ``times`` lines answered fail inside the batch with ``status`` (a 5xx or
        429: not the request's fault)."""
        self._line_faults.extend([status] * times)

    @property
    def open_batches(self) -> list[str]:
        """Ids of the batches still validating, running, finalizing or cancelling."""
        return [b.id for b in self.batches.values() if b.status in _OPEN]

    def status_of(self, batch_id: str) -> str:
        return self.batches[batch_id].status

    # -- routes --------------------------------------------------------------------------

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse | None:
        """Answer a Files, Batches or Message Batches request; None for any other path."""
        path, method = request.path, request.method
        anthropic = path.startswith("/v1/messages/batches")
        if not (anthropic or path.startswith(("/v1/files", "/v1/batches"))):
            return None
        fmt: Format = AnthropicFormat() if anthropic else OpenAIFormat()
        call = f"{method} {path}"
        if self.on_request is not None:
            self.on_request(call)
        fault = next((f for f in self._call_faults if call.startswith(f[0])), None)
        if fault is not None:
            self._call_faults.remove(fault)
            error = web.Response(
                status=fault[1], body=fmt.error("server", "The server had an error."), content_type=_JSON
            )
            if not fault[2]:
                return error
            await self._route(request, fmt, anthropic, path, method)  # it takes effect; the reply is lost
            return error
        return await self._route(request, fmt, anthropic, path, method)

    async def _route(
        self, request: web.BaseRequest, fmt: Format, anthropic: bool, path: str, method: str
    ) -> web.StreamResponse:
        try:
            fmt.check_auth(request.headers, self._server.api_key)
            owner = _owner(request.headers)
            parts = path.strip("/").split("/")
            if anthropic:
                return await self._anthropic(request, method, parts[3:], owner)
            if parts[1] == "files":
                return await self._files(request, method, parts[2:], owner)
            return await self._batches(request, method, parts[2:], owner)
        except ApiError as exc:
            return web.Response(status=exc.status, body=fmt.error(exc.kind, exc.message, exc.param), content_type=_JSON)

    async def _files(self, request: web.BaseRequest, method: str, rest: list[str], owner: str) -> web.StreamResponse:
        if method == "POST" and not rest:
            return _json(await self._upload(request, owner))
        if not rest:
            raise ApiError(404, "not_found", "No such route.")
        file = self.files.get(rest[0])
        if file is None or file.owner != owner:
            raise ApiError(404, "not_found", f"No such File object: {rest[0]}")
        if method == "GET" and rest[1:] == ["content"]:
            return web.Response(body=file.content, content_type="application/octet-stream")
        if method == "GET" and len(rest) == 1:
            return _json(file.public())
        if method == "DELETE" and len(rest) == 1:
            del self.files[file.id]
            return _json({"id": file.id, "object": "file", "deleted": True})
        raise ApiError(404, "not_found", "No such route.")

    async def _upload(self, request: web.BaseRequest, owner: str) -> dict[str, Any]:
        if not request.content_type.startswith("multipart/"):
            raise ApiError(400, "invalid_request", "Expected a multipart/form-data upload.")
        purpose, filename, content = None, "upload.jsonl", b""
        reader = await request.multipart()
        async for part in reader:
            if not isinstance(part, BodyPartReader):
                continue
            if part.name == "purpose":
                purpose = (await part.read()).decode()
            elif part.name == "file":
                filename = part.filename or filename
                content = bytes(await part.read())
        if purpose != "batch":
            raise ApiError(400, "invalid_request", "purpose must be 'batch'.", "purpose")
        file = _File(f"file-{next(self._ids)}", owner, purpose, filename, content, int(time.time()))
        self.files[file.id] = file
        return file.public()

    async def _batches(self, request: web.BaseRequest, method: str, rest: list[str], owner: str) -> web.StreamResponse:
        if method == "POST" and not rest:
            return _json(await self._create_openai(request, owner))
        if method == "GET" and not rest:
            return _json(self._list(request, owner, anthropic=False))
        batch = self._owned(rest[0], owner, anthropic=False)
        if method == "GET" and len(rest) == 1:
            return _json(self._openai_view(batch))
        if method == "POST" and rest[1:] == ["cancel"]:
            self._cancel(batch)
            return _json(self._openai_view(batch))
        raise ApiError(404, "not_found", "No such route.")

    async def _create_openai(self, request: web.BaseRequest, owner: str) -> dict[str, Any]:
        body = _body(await request.read())
        file = self.files.get(str(body.get("input_file_id")))
        if file is None or file.owner != owner:
            raise ApiError(400, "invalid_request", f"No such File object: {body.get('input_file_id')}", "input_file_id")
        endpoint = body.get("endpoint")
        if endpoint not in _ENDPOINTS:
            raise ApiError(400, "invalid_request", f"endpoint must be one of {list(_ENDPOINTS)}.", "endpoint")
        if body.get("completion_window") != "24h":
            raise ApiError(400, "invalid_request", "completion_window must be '24h'.", "completion_window")
        metadata = body.get("metadata") or {}
        if not isinstance(metadata, dict) or len(metadata) > 16:
            raise ApiError(400, "invalid_request", "metadata must be an object of at most 16 pairs.", "metadata")
        batch = self._new(owner, anthropic=False, endpoint=str(endpoint), file_id=file.id, metadata=metadata)
        batch.lines, batch.errors = _openai_lines(file.content, str(endpoint), self._server)
        self._start(batch)
        view = self._openai_view(batch)
        if self.on_created is not None:
            self.on_created(view)
        return view

    async def _anthropic(
        self, request: web.BaseRequest, method: str, rest: list[str], owner: str
    ) -> web.StreamResponse:
        if method == "POST" and not rest:
            body = _body(await request.read())
            requests = body.get("requests")
            if not isinstance(requests, list) or not requests:
                raise ApiError(400, "invalid_request", "requests: a non-empty list is required.", "requests")
            batch = self._new(owner, anthropic=True, endpoint="/v1/messages", file_id=None, metadata={})
            batch.lines = _anthropic_lines(requests, self._server)
            self._start(batch)
            view = self._anthropic_view(batch)
            if self.on_created is not None:
                self.on_created(view)
            return _json(view)
        if method == "GET" and not rest:
            return _json(self._list(request, owner, anthropic=True))
        batch = self._owned(rest[0], owner, anthropic=True)
        if method == "GET" and len(rest) == 1:
            return _json(self._anthropic_view(batch))
        if method == "GET" and rest[1:] == ["results"]:
            if batch.status != "ended":
                raise ApiError(400, "invalid_request", f"Batch {batch.id} has not ended; its results are not ready.")
            return web.Response(body=b"".join(_anthropic_results(batch)), content_type="application/binary")
        if method == "POST" and rest[1:] == ["cancel"]:
            self._cancel(batch)
            return _json(self._anthropic_view(batch))
        raise ApiError(404, "not_found", "No such route.")

    # -- batches -------------------------------------------------------------------------

    def _new(
        self, owner: str, *, anthropic: bool, endpoint: str, file_id: str | None, metadata: dict[str, str]
    ) -> _Batch:
        now = time.time()
        prefix = "msgbatch_" if anthropic else "batch_"
        batch = _Batch(
            f"{prefix}{next(self._ids):06d}",
            owner,
            anthropic,
            endpoint,
            file_id,
            {str(k): str(v) for k, v in metadata.items()},
            now,
            now + self.expire_after,
        )
        batch.stamps["created_at"] = now
        self.batches[batch.id] = batch
        return batch

    def _owned(self, batch_id: str, owner: str, *, anthropic: bool) -> _Batch:
        batch = self.batches.get(batch_id)
        if batch is None or batch.owner != owner or batch.anthropic != anthropic:
            raise ApiError(404, "not_found", f"No batch found with id '{batch_id}'.")
        return batch

    def _start(self, batch: _Batch) -> None:
        if batch.errors:
            self._end(batch, "failed")
            return
        limit = self.enqueued_token_limit
        if limit is not None:
            model = next((line.call.model for line in batch.lines if line.call is not None), "")
            queued = sum(
                b.tokens
                for b in self.batches.values()
                if b is not batch and b.owner == batch.owner and b.status in _OPEN and _model_of(b) == model
            )
            if queued + batch.tokens > limit:
                batch.errors = [
                    {
                        "code": "token_limit_exceeded",
                        "message": f"Enqueued token limit reached for {model}. Limit: {limit:,} enqueued tokens. "
                        "Please try again once some in_progress batches have been completed.",
                        "param": None,
                        "line": None,
                    }
                ]
                self._end(batch, "failed")
                return
        batch.task = asyncio.get_running_loop().create_task(self._run(batch))

    async def _run(self, batch: _Batch) -> None:
        # start_after is read again while the batch waits: a test may let a waiting batch start
        while time.time() < batch.created_at + self.start_after:
            if not await self._wait(batch, min(batch.created_at + self.start_after, time.time() + 0.25)):
                return
        batch.status = "in_progress"
        batch.stamps["in_progress_at"] = time.time()
        step = 0.0 if self.lines_per_second is None else 1.0 / self.lines_per_second
        for line in batch.lines:
            if step and not await self._wait(batch, time.time() + step):
                return
            self._answer(batch, line)
            if batch.cancel.is_set():
                break
            if not step and len(batch.done) % 500 == 0:
                await asyncio.sleep(0)  # a big batch answered at once still lets the server serve
        if batch.cancel.is_set():
            self._end(batch, "cancelled")
            return
        batch.status = "finalizing"
        batch.stamps["finalizing_at"] = time.time()
        self._end(batch, "completed")

    async def _wait(self, batch: _Batch, until: float) -> bool:
        """Sleep until ``until`` (wall clock); False when the batch was cancelled or expired
        meanwhile (and ended so)."""
        while True:
            now = time.time()
            if now >= batch.expires_at:
                self._end(batch, "expired")
                return False
            if now >= until:
                return True
            wake = min(until, batch.expires_at) - now
            try:
                await asyncio.wait_for(batch.cancel.wait(), None if math.isinf(wake) else wake)
            except TimeoutError:
                continue
            self._end(batch, "cancelled")
            return False

    def _answer(self, batch: _Batch, line: _Line) -> None:
        server = self._server
        fmt = _format_of(batch.endpoint, server)
        if line.problem is not None:
            error = fmt.error(line.problem.kind, line.problem.message, line.problem.param)
            batch.failed[line.custom_id] = _result_line(batch, line.custom_id, line.problem.status, error)
            return
        if self._line_faults:
            status = self._line_faults.pop(0)
            kind: ErrorKind = "overloaded" if status in (429, 529) else "server"
            error = fmt.error(kind, "The server had an error processing this request.")
            batch.failed[line.custom_id] = _result_line(batch, line.custom_id, status, error)
            return
        call = line.call
        assert call is not None
        # batch lines share the key's prompt cache, and read what earlier lines wrote
        call = server.prompt_cache.served(fmt.api, line.body, call, batch.owner, asyncio.get_running_loop().time())
        completion = min(call.max_tokens, server.output_tokens)
        n, created = server.next_number(), int(time.time())
        ask = server.structured.ask_of(line.body, fmt.api)
        if ask is not None:  # a line asking for JSON: answered as a synchronous request would be
            body = render(fmt, n, call, completion, server.structured.answer(ask)[0], ask, created)
        else:
            body = fmt.success(n, call, completion, completion < server.output_tokens, created)
        server.record_batch_success(line.custom_id, call, completion, self.discount)
        batch.done[line.custom_id] = _result_line(batch, line.custom_id, 200, body)

    def _cancel(self, batch: _Batch) -> None:
        if batch.status in ("validating", "in_progress"):
            batch.status = "cancelling"
            batch.stamps["cancelling_at"] = time.time()
            batch.cancel.set()
            if batch.task is None:
                self._end(batch, "cancelled")

    def _end(self, batch: _Batch, status: str) -> None:
        """The batch is over: its output and error files written (OpenAI), unanswered lines
        marked expired or cancelled."""
        if batch.status in ("completed", "failed", "expired", "cancelled", "ended"):
            return
        reason = {"expired": "batch_expired", "cancelled": "batch_cancelled"}.get(status)
        if reason is not None:
            for line in batch.lines:
                if line.custom_id not in batch.done and line.custom_id not in batch.failed:
                    batch.failed[line.custom_id] = _unanswered_line(batch, line.custom_id, reason)
        now = time.time()
        self._server.announce()
        batch.stamps[f"{'ended' if batch.anthropic else status}_at"] = now
        if batch.anthropic:
            batch.status = "ended"
            return
        batch.status = status
        if status != "failed":
            if batch.done:
                batch.output_file_id = self._store_file(batch.owner, b"".join(batch.done.values()))
            if batch.failed:
                batch.error_file_id = self._store_file(batch.owner, b"".join(batch.failed.values()))

    def _store_file(self, owner: str, content: bytes) -> str:
        file = _File(f"file-{next(self._ids)}", owner, "batch_output", "output.jsonl", content, int(time.time()))
        self.files[file.id] = file
        return file.id

    def _list(self, request: web.BaseRequest, owner: str, *, anthropic: bool) -> dict[str, Any]:
        try:
            limit = max(1, min(100, int(request.query.get("limit", "20"))))
        except ValueError:
            raise ApiError(400, "invalid_request", "limit must be an integer.", "limit") from None
        after = request.query.get("after_id" if anthropic else "after")
        mine = [b for b in reversed(self.batches.values()) if b.owner == owner and b.anthropic == anthropic]
        if after is not None:
            ids = [b.id for b in mine]
            mine = mine[ids.index(after) + 1 :] if after in ids else []
        page = mine[:limit]
        view = self._anthropic_view if anthropic else self._openai_view
        data = [view(b) for b in page]
        first, last = (page[0].id, page[-1].id) if page else (None, None)
        listing: dict[str, Any] = {"data": data, "has_more": len(mine) > limit, "first_id": first, "last_id": last}
        if not anthropic:
            listing["object"] = "list"
        return listing

    def _openai_view(self, batch: _Batch) -> dict[str, Any]:
        stamps = batch.stamps
        total = len(batch.lines)
        return {
            "id": batch.id,
            "object": "batch",
            "endpoint": batch.endpoint,
            "errors": None if not batch.errors else {"object": "list", "data": batch.errors},
            "input_file_id": batch.input_file_id,
            "completion_window": "24h",
            "status": batch.status,
            "output_file_id": batch.output_file_id,
            "error_file_id": batch.error_file_id,
            "created_at": int(batch.created_at),
            "expires_at": int(batch.expires_at),
            **{
                name: _int(stamps.get(name))
                for name in (
                    "in_progress_at",
                    "finalizing_at",
                    "completed_at",
                    "failed_at",
                    "expired_at",
                    "cancelling_at",
                    "cancelled_at",
                )
            },
            "request_counts": {"total": total, "completed": len(batch.done), "failed": len(batch.failed)},
            "metadata": batch.metadata,
        }

    def _anthropic_view(self, batch: _Batch) -> dict[str, Any]:
        kinds = [_anthropic_kind(batch, line.custom_id) for line in batch.lines]
        ended = batch.status == "ended"
        status = "ended" if ended else ("canceling" if batch.status == "cancelling" else "in_progress")
        return {
            "id": batch.id,
            "type": "message_batch",
            "processing_status": status,
            "request_counts": {
                "processing": kinds.count(None),
                "succeeded": kinds.count("succeeded"),
                "errored": kinds.count("errored"),
                "canceled": kinds.count("canceled"),
                "expired": kinds.count("expired"),
            },
            "ended_at": _iso(batch.stamps.get("ended_at")),
            "created_at": _iso(batch.created_at),
            "expires_at": _iso(batch.expires_at),
            "cancel_initiated_at": _iso(batch.stamps.get("cancelling_at")),
            "results_url": f"/v1/messages/batches/{batch.id}/results" if ended else None,
        }


def _openai_lines(content: bytes, endpoint: str, server: FakeServer) -> tuple[list[_Line], list[dict[str, Any]]]:
    """The batch's requests, or what is wrong with its file (OpenAI fails the whole batch
    for a line that is not a request, while validating)."""
    lines: list[_Line] = []
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()

    def problem(code: str, message: str, number: int) -> None:
        errors.append({"code": code, "message": message, "param": None, "line": number})

    for number, raw in enumerate(content.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            item = loads(raw)
        except ValueError:
            problem("invalid_json_line", f"Line {number} is not valid JSON.", number)
            continue
        if not isinstance(item, dict) or not isinstance(item.get("custom_id"), str):
            problem("missing_required_parameter", f"Line {number}: custom_id is required.", number)
            continue
        custom_id = item["custom_id"]
        if custom_id in seen:
            problem("duplicate_custom_id", f"Line {number}: custom_id {custom_id!r} is not unique.", number)
            continue
        seen.add(custom_id)
        if item.get("url") != endpoint or item.get("method", "POST") != "POST":
            problem("mismatched_endpoint", f"Line {number}: url must be {endpoint!r} as the batch's.", number)
            continue
        if not isinstance(item.get("body"), dict):
            problem("missing_required_parameter", f"Line {number}: body is required.", number)
            continue
        lines.append(_parsed(custom_id, item["body"], server, endpoint))
    if not lines and not errors:
        errors.append({"code": "empty_file", "message": "The input file has no requests.", "param": None, "line": None})
    return lines, errors


def _anthropic_lines(requests: list[Any], server: FakeServer) -> list[_Line]:
    lines: list[_Line] = []
    seen: set[str] = set()
    for index, item in enumerate(requests):
        if (
            not isinstance(item, dict)
            or not isinstance(item.get("custom_id"), str)
            or not isinstance(item.get("params"), dict)
        ):
            raise ApiError(400, "invalid_request", f"requests.{index}: custom_id and params are required.")
        if item["custom_id"] in seen:
            raise ApiError(400, "invalid_request", f"requests.{index}: custom_id {item['custom_id']!r} is not unique.")
        seen.add(item["custom_id"])
        lines.append(_parsed(item["custom_id"], item["params"], server, "/v1/messages"))
    return lines


def _format_of(endpoint: str, server: FakeServer) -> Format:
    """How the lines of a batch for ``endpoint`` read and are answered."""
    if endpoint == "/v1/messages":
        return AnthropicFormat(server.counter)
    return ResponsesFormat(server.counter) if endpoint == "/v1/responses" else OpenAIFormat(server.counter)


def _parsed(custom_id: str, body: Any, server: FakeServer, endpoint: str) -> _Line:
    fmt = _format_of(endpoint, server)
    line = _Line(custom_id, body)
    try:
        line.call = fmt.parse(body, {"anthropic-version": "2023-06-01"})  # the batch request carried it
    except ApiError as exc:
        line.problem = exc
    refused = server.batches.reject(body) if server.batches.reject is not None and isinstance(body, Mapping) else None
    if line.problem is None and refused:
        line.problem = ApiError(400, "invalid_request", refused)
    return line


def _result_line(batch: _Batch, custom_id: str, status: int, body: bytes) -> bytes:
    if batch.anthropic:
        decoded = loads(body)
        if status == 200:
            result: dict[str, Any] = {"type": "succeeded", "message": decoded}
        else:
            result = {"type": "errored", "error": decoded}
        return dumps({"custom_id": custom_id, "result": result}) + b"\n"
    response = {"status_code": status, "request_id": f"req_b{abs(hash(custom_id)) % 10**9}", "body": loads(body)}
    return dumps({"id": f"batch_req_{custom_id}", "custom_id": custom_id, "response": response, "error": None}) + b"\n"


def _unanswered_line(batch: _Batch, custom_id: str, reason: str) -> bytes:
    if batch.anthropic:
        kind = "expired" if reason == "batch_expired" else "canceled"
        return dumps({"custom_id": custom_id, "result": {"type": kind}}) + b"\n"
    message = (
        "This request could not be executed before the completion window expired."
        if reason == "batch_expired"
        else "This request was not executed because the batch was cancelled."
    )
    error = {"code": reason, "message": message}
    return dumps({"id": f"batch_req_{custom_id}", "custom_id": custom_id, "response": None, "error": error}) + b"\n"


def _anthropic_results(batch: _Batch) -> Iterator[bytes]:
    for line in batch.lines:
        yield batch.done.get(line.custom_id) or batch.failed[line.custom_id]


def _anthropic_kind(batch: _Batch, custom_id: str) -> str | None:
    if custom_id in batch.done:
        return "succeeded"
    failed = batch.failed.get(custom_id)
    if failed is None:
        return None
    return str(loads(failed)["result"]["type"])


def _model_of(batch: _Batch) -> str:
    return next((line.call.model for line in batch.lines if line.call is not None), "")


def _owner(headers: Mapping[str, str]) -> str:
    return headers.get("x-api-key") or headers.get("Authorization", "").removeprefix("Bearer ")


def _body(raw: bytes) -> dict[str, Any]:
    try:
        body = loads(raw)
    except ValueError:
        raise ApiError(400, "invalid_request", "We could not parse the JSON body of your request.") from None
    if not isinstance(body, dict):
        raise ApiError(400, "invalid_request", "The body must be a JSON object.")
    return body


def _json(data: Any) -> web.Response:
    return web.Response(body=dumps(data), content_type=_JSON)


def _int(stamp: float | None) -> int | None:
    return None if stamp is None else int(stamp)


def _iso(stamp: float | None) -> str | None:
    if stamp is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(stamp))
