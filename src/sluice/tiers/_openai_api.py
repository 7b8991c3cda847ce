"""OpenAI's Files + Batches API (and any server that speaks it: Azure OpenAI's batch
deployments, ``sluice serve``, the fake in :mod:`sluice.testing`): a chunk is uploaded as
a JSONL file and a batch created over it with the job's tags in ``metadata``; results
come as an output file and an error file."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

from .. import _json
from .._errors import BatchIncompleteError, InvalidRequestError, MalformedResponseError
from .._models import Deployment, Request
from ..providers._http import untranslatable
from ._api import BatchAPI, Outcome

if TYPE_CHECKING:
    import aiohttp

    from ..providers import HttpProvider, Reply

__all__ = ["OpenAIBatches"]

_ENDED = ("completed", "failed", "expired", "cancelled")


class OpenAIBatches(BatchAPI):
    max_lines = 50_000
    max_bytes = 190 * 1024 * 1024  # OpenAI takes 200 MB
    tags_batches = True
    endpoint = "/v1/chat/completions"

    def __init__(self, provider: HttpProvider, deployment: Deployment, session: aiohttp.ClientSession) -> None:
        super().__init__(provider, deployment, session)
        base = getattr(provider, "base_url", None)
        if base is None:
            raise TypeError(f"{type(provider).__name__} has no base_url: not an OpenAI-compatible provider")
        self._base = str(base(deployment))
        #: Each chunk's uploaded file, until its batch is created.
        self._uploaded: dict[str, str] = {}

    def body_of(self, request: Request) -> dict[str, Any]:
        """A line's body for ``/v1/chat/completions``, every line's URL: a request written for
        the Responses API goes as its translation (refused if that lost something), as to a
        deployment that does not speak it."""
        native = request.native
        if native is not None and native.api == "responses":
            if native.lost:
                raise InvalidRequestError(untranslatable(native, self.deployment))
            request = dataclasses.replace(request, native=None)
        return super().body_of(request)

    def line(self, custom_id: str, body: Mapping[str, Any]) -> bytes:
        return _json.dumps({"custom_id": custom_id, "method": "POST", "url": self.endpoint, "body": body}) + b"\n"

    async def submit(self, lines: list[bytes], tags: Mapping[str, str], *, count: int | None = None) -> dict[str, Any]:
        import aiohttp

        name = f"sluice-{'-'.join(tags.values())}.jsonl"
        chunk = tags.get("sluice_chunk", "")
        file_id = self._uploaded.get(chunk)  # a chunk refused for the token limit goes again: its file is there
        if file_id is None:
            if not lines:
                raise BatchIncompleteError(f"chunk {chunk}'s file was not uploaded and its lines are not kept")
            content = b"".join(lines)

            def form() -> aiohttp.FormData:
                data = aiohttp.FormData()
                data.add_field("purpose", "batch")
                data.add_field("file", content, filename=name, content_type="application/jsonl")
                return data

            file_id = self._uploaded[chunk] = str((await self.call("POST", f"{self._base}/files", form=form))["id"])
        create = {"input_file_id": file_id, "endpoint": self.endpoint, "completion_window": "24h", "metadata": tags}
        payload = _json.dumps(create)

        async def once() -> dict[str, Any]:
            return await self.call("POST", f"{self._base}/batches", payload=payload, tries=1)

        return await self.create_once(once, tags, lines=len(lines) if count is None else count)

    def forget(self, chunk: str) -> None:
        self._uploaded.pop(chunk, None)

    async def retrieve(self, batch_id: str) -> dict[str, Any]:
        return await self.call("GET", f"{self._base}/batches/{batch_id}")

    def status(self, batch: Mapping[str, Any]) -> str:
        return str(batch.get("status"))

    def ended(self, batch: Mapping[str, Any]) -> bool:
        return batch.get("status") in _ENDED

    def progress(self, batch: Mapping[str, Any]) -> tuple[int, int] | None:
        counts = batch.get("request_counts")
        if not isinstance(counts, dict) or not isinstance(counts.get("total"), int) or not counts["total"]:
            return None
        done = sum(v for k, v in counts.items() if k in ("completed", "failed") and isinstance(v, int))
        return done, int(counts["total"])

    def token_limited(self, batch: Mapping[str, Any]) -> bool:
        return batch.get("status") == "failed" and any(e.get("code") == "token_limit_exceeded" for e in _errors(batch))

    def why_unanswered(self, batch: Mapping[str, Any]) -> str:
        messages = [str(e.get("message")) for e in _errors(batch)]
        return "; ".join(messages[:3]) or "no result for this line"

    async def find(self, tags: Mapping[str, str], *, since: float, lines: int) -> dict[str, Any] | None:
        after: str | None = None
        while True:
            query = "?limit=100" + (f"&after={after}" if after else "")
            page = await self.call("GET", f"{self._base}/batches{query}")
            data = page.get("data") or []
            for batch in data:
                found = batch.get("metadata") or {}
                refused = batch.get("status") == "failed"  # it answered nothing (a token-limit refusal)
                if not refused and all(found.get(k) == v for k, v in tags.items()):
                    return dict(batch)
            if not page.get("has_more") or not data or float(data[-1].get("created_at") or 0) < since - 60:
                return None
            after = str(data[-1]["id"])

    async def results(self, batch: Mapping[str, Any]) -> AsyncIterator[Outcome]:
        for key in ("output_file_id", "error_file_id"):
            file_id = batch.get(key)
            if not file_id:
                continue
            async for line in self.stream_lines(f"{self._base}/files/{file_id}/content"):
                try:
                    item = _json.loads(line)
                except ValueError:
                    continue
                if isinstance(item, Mapping) and isinstance(item.get("custom_id"), str):
                    response = item.get("response")
                    ok = isinstance(response, Mapping) and response.get("status_code") == 200
                    yield str(item["custom_id"]), ok, line, item

    async def cancel(self, batch_id: str) -> dict[str, Any]:
        return await self.call("POST", f"{self._base}/batches/{batch_id}/cancel")

    def reply(self, batch_id: str, line: bytes) -> Reply:
        label = self.deployment.label
        try:
            item = _json.loads(line)
            response, error = item.get("response"), item.get("error")
        except (ValueError, AttributeError):
            raise MalformedResponseError(f"{label}: batch {batch_id} gave a line that is not JSON") from None
        if not isinstance(response, Mapping):
            what = error.get("message") if isinstance(error, Mapping) else "no response"
            code = error.get("code") if isinstance(error, Mapping) else None
            raise BatchIncompleteError(f"batch {batch_id} did not answer this line ({code}: {what})")
        status = int(response.get("status_code") or 0)
        body = _json.dumps(response.get("body") or {})
        request_id = response.get("request_id")
        if status != 200:
            raise self.provider.error_of(status, body, {}, request_id, None, self.deployment)
        return self.provider.reply_of(body, request_id, None, self.deployment)


def _errors(batch: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    errors = batch.get("errors")
    data = errors.get("data") if isinstance(errors, Mapping) else None
    return [e for e in data or [] if isinstance(e, Mapping)]
