"""OpenAI's Files + Batches API, as the batch tier uses it: upload a chunk's lines, create
its batch with the job's tags, read its state, list the key's batches (to find one a
crash left unrecorded), cancel, and stream a result file's lines.

Also any server that speaks it (Azure OpenAI's batch deployments, ``sluice serve``, the
fake in :mod:`sluice.testing`). Requests go through the deployment's own provider for
its URL, key, and the typed errors of a refused call.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

from .. import _json
from .._errors import MalformedResponseError, ProviderError, RetryableError
from .._models import Deployment

if TYPE_CHECKING:
    import aiohttp

    from ..providers import HttpProvider

__all__ = ["OpenAIBatches"]

#: Seconds one call of this API may take (an upload of 200 MB included).
_CALL_TIMEOUT = 600.0
#: Tries of a call that failed on the way (connection, 5xx, 429) before it is given up.
_TRIES = 6


class OpenAIBatches:
    """The Files + Batches endpoints of one deployment."""

    def __init__(self, provider: HttpProvider, deployment: Deployment, session: aiohttp.ClientSession) -> None:
        self._provider = provider
        self._deployment = deployment
        self._session = session
        base = getattr(provider, "base_url", None)
        if base is None:
            raise TypeError(f"{type(provider).__name__} has no base_url: not an OpenAI-compatible provider")
        self._base = str(base(deployment))
        headers = provider.headers_for(deployment)
        headers.pop("content-type", None)
        self._headers = headers

    async def upload(self, content: bytes, filename: str) -> str:
        """Upload a JSONL file for a batch; its file id."""
        import aiohttp

        def form() -> aiohttp.FormData:
            data = aiohttp.FormData()
            data.add_field("purpose", "batch")
            data.add_field("file", content, filename=filename, content_type="application/jsonl")
            return data

        body = await self._json("POST", "/files", form=form)
        return str(body["id"])

    async def create(self, file_id: str, endpoint: str, metadata: Mapping[str, str]) -> dict[str, Any]:
        """Create a batch over an uploaded file (not retried: a create that may have landed
        is looked up by its metadata, never sent twice)."""
        payload: dict[str, Any] = {"input_file_id": file_id, "endpoint": endpoint, "completion_window": "24h"}
        payload["metadata"] = dict(metadata)
        return await self._json("POST", "/batches", payload=payload, tries=1)

    async def retrieve(self, batch_id: str) -> dict[str, Any]:
        return await self._json("GET", f"/batches/{batch_id}")

    async def cancel(self, batch_id: str) -> dict[str, Any]:
        return await self._json("POST", f"/batches/{batch_id}/cancel")

    async def find(self, metadata: Mapping[str, str], *, since: float) -> dict[str, Any] | None:
        """The newest batch tagged with ``metadata``, looking back to ``since`` (Unix time)."""
        after: str | None = None
        while True:
            query = "?limit=100" + (f"&after={after}" if after else "")
            page = await self._json("GET", f"/batches{query}")
            data = page.get("data") or []
            for batch in data:
                tags = batch.get("metadata") or {}
                if all(tags.get(k) == v for k, v in metadata.items()):
                    return dict(batch)
            if not page.get("has_more") or not data or float(data[-1].get("created_at") or 0) < since - 60:
                return None
            after = str(data[-1]["id"])

    async def lines(self, file_id: str) -> AsyncIterator[bytes]:
        """A result file's lines, streamed (a big output never sits in memory whole)."""
        import aiohttp

        url = f"{self._base}/files/{file_id}/content"
        try:
            async with self._session.get(url, headers=self._headers, allow_redirects=False) as response:
                if response.status != 200:
                    raise self._refused(response.status, await response.read(), response.headers)
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
            raise RetryableError(f"{self._deployment.label}: reading batch file {file_id} failed ({exc})") from None

    # -- the round trip --------------------------------------------------------------------

    async def _json(
        self,
        method: str,
        path: str,
        *,
        payload: Mapping[str, Any] | None = None,
        form: Any = None,
        tries: int = _TRIES,
    ) -> dict[str, Any]:
        """One call, tried again (backing off) while it fails on the way."""
        import aiohttp

        delay = 1.0
        for attempt in range(1, tries + 1):
            try:
                data = form() if form is not None else (None if payload is None else _json.dumps(payload))
                headers = dict(self._headers)
                if payload is not None:
                    headers["content-type"] = "application/json"
                timeout = aiohttp.ClientTimeout(total=_CALL_TIMEOUT)
                async with self._session.request(
                    method, self._base + path, data=data, headers=headers, timeout=timeout, allow_redirects=False
                ) as response:
                    raw = await response.read()
                    if response.status != 200:
                        raise self._refused(response.status, raw, response.headers)
                body = _json.loads(raw)
                if not isinstance(body, dict):
                    raise MalformedResponseError(f"{self._deployment.label}: {method} {path} answered {raw[:80]!r}")
                return body
            except (TimeoutError, aiohttp.ClientError, RetryableError, ValueError) as exc:
                if attempt >= tries:
                    if isinstance(exc, ProviderError):
                        raise
                    raise RetryableError(f"{self._deployment.label}: {method} {path} failed ({exc})") from None
                await asyncio.sleep(delay)
                delay = min(delay * 2, 60.0)
        raise AssertionError("unreachable")

    def _refused(self, status: int, raw: bytes, headers: Mapping[str, str]) -> ProviderError:
        request_id = headers.get("x-request-id")
        return self._provider.error_of(status, raw, headers, request_id, None, self._deployment)
