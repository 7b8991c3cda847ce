"""What the batch tier needs of a provider's Batch API, and the round trip both share.

:class:`BatchAPI` is one deployment's batch endpoints: write a request as a batch line,
submit a chunk of lines (tagged, where the API can tag), read a batch's state, find a
batch a crash left unrecorded, stream its results, cancel it, and turn a result line into
a Reply or the typed error of a failed request. ``_openai_api`` and ``_anthropic_api``
implement it.
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from .. import _json
from .._errors import MalformedResponseError, ProviderError, RetryableError
from .._models import Deployment, Request

if TYPE_CHECKING:
    import aiohttp

    from ..providers import HttpProvider, Reply

__all__ = ["BatchAPI", "Outcome"]

#: Seconds one call may take (an upload of 200 MB included).
_CALL_TIMEOUT = 600.0
#: Tries of a call that failed on the way (connection, 5xx, 429) before it is given up.
_TRIES = 6
#: Tries of a batch's create, each followed by a search for it (see ``create_once``).
_CREATE_TRIES = 4

#: A result line: (custom id, answered with a 200, the line as the provider wrote it, the
#: line decoded: read once, see ``_readback``).
Outcome = tuple[str, bool, bytes, Any]


class BatchAPI(ABC):
    """One deployment's Batch API (see the module docstring)."""

    #: The most lines and bytes one batch may hold.
    max_lines: int
    max_bytes: int
    #: Whether a batch carries the job's tags, so a crash's orphan can be found for sure.
    tags_batches: bool

    def __init__(self, provider: HttpProvider, deployment: Deployment, session: aiohttp.ClientSession) -> None:
        self.provider = provider
        self.deployment = deployment
        self._session = session
        headers = provider.headers_for(deployment)
        headers.pop("content-type", None)
        self.headers = headers

    def body_of(self, request: Request) -> dict[str, Any]:
        """A line's body: the request as the provider would send it."""
        return self.provider.body_of(request, self.deployment)

    @abstractmethod
    def line(self, custom_id: str, body: Mapping[str, Any]) -> bytes:
        """One request as a line of a batch (newline-terminated JSON)."""

    @abstractmethod
    async def submit(self, lines: list[bytes], tags: Mapping[str, str], *, count: int | None = None) -> dict[str, Any]:
        """Create a batch of ``lines``, once: a create that may have landed is looked up,
        never sent twice. Returns the batch as the API describes it. A chunk refused for
        the enqueued-token limit may be submitted again with no ``lines`` (and their
        ``count``) where the API kept its upload."""

    def forget(self, chunk: str) -> None:
        """The chunk's batch ran (or was given up): what :meth:`submit` kept to submit it again can go."""
        return None  # nothing kept by default

    @abstractmethod
    async def retrieve(self, batch_id: str) -> dict[str, Any]: ...

    @abstractmethod
    def status(self, batch: Mapping[str, Any]) -> str:
        """The batch's status as the provider names it."""

    @abstractmethod
    def ended(self, batch: Mapping[str, Any]) -> bool: ...

    def token_limited(self, batch: Mapping[str, Any]) -> bool:
        """Refused because the queue holds too many tokens already (submit it again later)."""
        return False

    def progress(self, batch: Mapping[str, Any]) -> tuple[int, int] | None:
        """(lines done, lines) as the batch counts them; None when it does not say."""
        return None

    def why_unanswered(self, batch: Mapping[str, Any]) -> str:
        return "no result for this line"

    @abstractmethod
    async def find(self, tags: Mapping[str, str], *, since: float, lines: int) -> dict[str, Any] | None:
        """The batch a crash created without its id being recorded, if it can be found."""

    @abstractmethod
    def results(self, batch: Mapping[str, Any]) -> AsyncIterator[Outcome]:
        """An ended batch's result lines, streamed."""

    @abstractmethod
    async def cancel(self, batch_id: str) -> dict[str, Any]: ...

    @abstractmethod
    def reply(self, batch_id: str, line: bytes) -> Reply:
        """The answer in a result line; raises the typed error of a failed request, or
        BatchIncompleteError for a line the batch did not answer."""

    async def create_once(
        self, create: Callable[[], Awaitable[dict[str, Any]]], tags: Mapping[str, str], *, lines: int
    ) -> dict[str, Any]:
        """Create a batch without ever making two: each try is sent once (no retry inside
        the round trip); after a try that failed on the way, the provider's batches are
        searched for it (it may have landed) before the next try."""
        since = time.time()
        for attempt in range(1, _CREATE_TRIES + 1):
            try:
                return await create()
            except ProviderError as exc:
                if not exc.retryable:
                    raise
                failure = exc
            await asyncio.sleep(2.0 * attempt)  # the listing may lag the create
            found = await self.find(tags, since=since, lines=lines)  # after the last try too
            if found is not None:
                return found
        raise failure

    # -- the round trip --------------------------------------------------------------------

    async def call(
        self,
        method: str,
        url: str,
        *,
        payload: bytes | None = None,
        form: Callable[[], Any] | None = None,
        tries: int = _TRIES,
    ) -> dict[str, Any]:
        """One JSON call, tried again (backing off) while it fails on the way."""
        import aiohttp

        delay = 1.0
        for attempt in range(1, tries + 1):
            try:
                headers = dict(self.headers)
                if payload is not None:
                    headers["content-type"] = "application/json"
                data = form() if form is not None else payload
                timeout = aiohttp.ClientTimeout(total=_CALL_TIMEOUT)
                async with self._session.request(
                    method, url, data=data, headers=headers, timeout=timeout, allow_redirects=False
                ) as response:
                    raw = await response.read()
                    if response.status != 200:
                        raise self.refused(response.status, raw, response.headers)
                body = _json.loads(raw)
                if not isinstance(body, dict):
                    raise MalformedResponseError(f"{self.deployment.label}: {method} {url} answered {raw[:80]!r}")
                return body
            except (TimeoutError, aiohttp.ClientError, RetryableError, ValueError) as exc:
                if attempt >= tries:
                    if isinstance(exc, ProviderError):
                        raise
                    raise RetryableError(f"{self.deployment.label}: {method} {url} failed ({exc})") from None
                await asyncio.sleep(delay)
                delay = min(delay * 2, 60.0)
        raise AssertionError("unreachable")

    async def stream_lines(self, url: str) -> AsyncIterator[bytes]:
        """A JSONL download's lines as they arrive (a big one never sits in memory whole)."""
        import aiohttp

        try:
            async with self._session.get(url, headers=self.headers, allow_redirects=False) as response:
                if response.status != 200:
                    raise self.refused(response.status, await response.read(), response.headers)
                buffer = b""
                async for piece in response.content.iter_chunked(1 << 16):
                    buffer += piece
                    *complete, buffer = buffer.split(b"\n")
                    for line in complete:
                        if line.strip():
                            yield line
                if buffer.strip():
                    yield buffer
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise RetryableError(f"{self.deployment.label}: reading {url} failed ({exc})") from None

    def refused(self, status: int, raw: bytes, headers: Mapping[str, str]) -> ProviderError:
        request_id = headers.get(self.provider.request_id_header)
        return self.provider.error_of(status, raw, headers, request_id, None, self.deployment)
