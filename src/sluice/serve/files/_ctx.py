"""What the Files and Batches handlers share: the bookkeeping, the limits, the caller.

Kept apart from the handlers so ``_files`` and ``batches._batches`` need not import each other.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from ...batch._inputs import InputOptions
from ..core._keys import CLIENT, ClientLike
from ._db import BatchDB
from ._uploads import Uploads

if TYPE_CHECKING:
    from ..._budget import Budget

__all__ = [
    "BATCH_CTX",
    "CHAT",
    "EMBEDDINGS",
    "MESSAGES",
    "RESPONSES",
    "BatchContext",
    "Caller",
    "Limits",
    "ModelCheck",
    "batch_objects",
    "caller",
    "derived_id",
    "new_batch",
    "new_id",
    "query_int",
]

#: ``check(client, model)``: the engine's name for a model the client asked for, or None
#: when the client may not use it (``sluice serve`` passes its ``[[client]] models`` check).
ModelCheck = Callable[[ClientLike, str], "str | None"]

#: Where uploads and outputs live: ``STATE_DIR/files/<file id>``.
FILES_DIR = "files"

#: The endpoints a batch runs: OpenAI's Batch API takes the first three; ``MESSAGES`` is
#: the internal batch behind an Anthropic Message Batch (see ``message_batches._message_batches``).
CHAT = "/v1/chat/completions"
EMBEDDINGS = "/v1/embeddings"
RESPONSES = "/v1/responses"
MESSAGES = "/v1/messages"


@dataclass(frozen=True, slots=True)
class Limits:
    """What an upload may be. OpenAI's own: 200 MB and 50,000 requests per batch file;
    Anthropic's for a Message Batch: 256 MB and 100,000 requests. And what a client may
    hold and do at once (``[serve]``'s ``client_files_mb``, ``client_files``,
    ``file_ttl_days``, ``client_uploads``, ``upload_timeout_s``; see ``_uploads``)."""

    max_file_bytes: int = 200 * 1024 * 1024
    max_requests: int = 50_000
    #: One request line (a long chat with images inlined as base64 can be large); also
    #: one request of a Message Batch, as its line is written.
    max_line_bytes: int = 8 * 1024 * 1024
    max_message_batch_bytes: int = 256 * 1024 * 1024
    max_message_requests: int = 100_000
    #: JSON values and keys one request line (or Message Batch request) may hold (see ``core._body``).
    max_values: int = 1_000_000
    #: Bytes and files one client may hold (its batches' outputs and Message Batches count).
    client_file_bytes: int = 1024 * 1024 * 1024
    client_files: int = 1000
    #: Seconds a file is kept after it was made (0: for ever).
    file_ttl_s: float = 30 * 24 * 3600.0
    #: Uploads (and Message Batch bodies) one client may send at once, and the longest one may take.
    client_uploads: int = 4
    upload_timeout_s: float = 600.0

    def requests_for(self, endpoint: str) -> int:
        """The most requests one batch of ``endpoint`` may hold."""
        return self.max_message_requests if endpoint == MESSAGES else self.max_requests


@dataclass(frozen=True, slots=True)
class Caller:
    """The client a request comes from (``"default"``, with no budget, without auth)."""

    name: str = "default"
    budget: Budget | None = None


class BatchContext:
    """Made when the routes are added; opened at startup, once ``app[STATE_DIR]`` is known."""

    def __init__(
        self, limits: Limits, resolve_model: ModelCheck | None = None, inputs: InputOptions | None = None
    ) -> None:
        self.limits = limits
        self.resolve_model = resolve_model
        #: How a batch's lines become requests.
        self.inputs = inputs or InputOptions(line_schemas=False)
        self._db: BatchDB | None = None
        self._state_dir: Path | None = None
        #: The uploads under way, by client (their number and bytes, for the quotas).
        self.uploads = Uploads(
            per_client=limits.client_uploads, quota_bytes=limits.client_file_bytes, quota_files=limits.client_files
        )
        #: The clients seen by the handlers, by name.
        self.seen: dict[str, ClientLike] = {}
        #: Batches resumed at startup whose client's budget is not known yet: they start
        #: when the client is first seen (see ``setup_batch_api(client_named=)``).
        self.parked: dict[str, list[Callable[[ClientLike], None]]] = {}

    def open(self, state_dir: Path) -> None:
        self._state_dir = state_dir
        self._db = BatchDB(state_dir / "batches.db", self.limits.file_ttl_s)

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    @property
    def db(self) -> BatchDB:
        if self._db is None:
            raise RuntimeError("the Batch API is used before the app started")
        return self._db

    @property
    def state_dir(self) -> Path:
        if self._state_dir is None:
            raise RuntimeError("the Batch API is used before the app started")
        return self._state_dir

    @property
    def files_dir(self) -> Path:
        return self.state_dir / FILES_DIR

    def file_path(self, file_id: str) -> Path:
        return self.files_dir / file_id


BATCH_CTX: web.AppKey[BatchContext] = web.AppKey("sluice.batch_ctx", BatchContext)


def caller(request: web.Request) -> ClientLike:
    """``request[CLIENT]``, set by the auth middleware; without one, the anonymous client."""
    client: ClientLike | None = request.get(CLIENT)
    if client is None:
        return Caller()
    ctx = request.app[BATCH_CTX]
    ctx.seen[client.name] = client
    for resume in ctx.parked.pop(client.name, []):
        resume(client)
    return client


def new_id(prefix: str, nbytes: int = 12) -> str:
    return prefix + secrets.token_hex(nbytes)


#: A batch's completion window, the only one OpenAI and Anthropic offer.
WINDOW_S = 24 * 3600


def new_batch(batch_id: str, endpoint: str, file_id: str, requests: int, metadata: Any = None) -> dict[str, Any]:
    """A batch object as it is created (``validating``), in OpenAI's shape: every batch is
    kept so, a Message Batch too (whose view is made from it)."""
    now = int(time.time())
    return {
        "id": batch_id,
        "object": "batch",
        "endpoint": endpoint,
        "model": None,
        "errors": None,
        "input_file_id": file_id,
        "completion_window": "24h",
        "status": "validating",
        "output_file_id": None,
        "error_file_id": None,
        "created_at": now,
        "in_progress_at": None,
        "expires_at": now + WINDOW_S,
        "finalizing_at": None,
        "completed_at": None,
        "failed_at": None,
        "expired_at": None,
        "cancelling_at": None,
        "cancelled_at": None,
        "request_counts": {"total": requests, "completed": 0, "failed": 0},
        "usage": None,  # filled in when it ends, as OpenAI does
        "metadata": metadata,
    }


def derived_id(prefix: str, *parts: str, nbytes: int = 12) -> str:
    """An id that is the same every time it is made from the same parts (a finalize that
    is redone after a crash replaces its files instead of leaving orphans)."""
    digest = hashlib.sha256("\x1f".join(parts).encode()).hexdigest()
    return prefix + digest[: nbytes * 2]


def batch_objects(batch_id: str) -> list[str]:
    """A batch and its output and error files (their ids are derived from the batch's): what
    a replica records it holds when it makes the batch."""
    return [batch_id, *(derived_id("file-", batch_id, kind) for kind in ("output", "errors"))]


def query_int(request: web.Request, name: str, default: int, lo: int, hi: int) -> int | str:
    """A bounded integer query parameter, or the message saying what is wrong with it."""
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        return f"{name} must be an integer, got {raw!r}"
    if not lo <= value <= hi:
        return f"{name} must be between {lo} and {hi}, got {value}"
    return value
