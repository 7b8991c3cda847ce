"""Anthropic's Message Batches API: a chunk is one ``POST /v1/messages/batches`` of
``{"custom_id", "params"}`` requests; results are one JSONL stream when it has ended.

Anthropic's batches carry no metadata, so a batch whose id a crash kept from being
recorded is found by what can be seen of it: created after its chunk was journalled, not
ended, holding exactly as many requests, and not already one of the job's. When exactly
one batch fits it is followed; otherwise the chunk's lines go again and the orphan (at
most one batch per crash, ``--batch-size`` lines) may be billed as well.
"""

from __future__ import annotations

import datetime
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

from .. import _json
from .._errors import BatchIncompleteError, MalformedResponseError
from ..providers._anthropic_stream import ERROR_STATUS
from ._api import BatchAPI, Outcome

if TYPE_CHECKING:
    import aiohttp

    from .._models import Deployment
    from ..providers import HttpProvider, Reply

__all__ = ["AnthropicBatches"]


#: Seconds after a chunk is journalled within which its batch must have been created to be
#: taken for it (an untagged batch created later is another chunk's, or another job's).
_CREATE_WINDOW = 120.0


class AnthropicBatches(BatchAPI):
    max_lines = 100_000
    max_bytes = 250 * 1024 * 1024  # Anthropic takes 256 MB
    tags_batches = False

    def __init__(self, provider: HttpProvider, deployment: Deployment, session: aiohttp.ClientSession) -> None:
        super().__init__(provider, deployment, session)
        self._url = provider.url_for(deployment) + "/batches"
        #: Batch ids the job already knows (never adopted for another chunk).
        self.known: set[str] = set()

    def line(self, custom_id: str, body: Mapping[str, Any]) -> bytes:
        return _json.dumps({"custom_id": custom_id, "params": body}) + b"\n"

    async def submit(self, lines: list[bytes], tags: Mapping[str, str], *, count: int | None = None) -> dict[str, Any]:
        if not lines:  # never asked: Message Batches have no enqueued-token refusal to submit again after
            raise BatchIncompleteError("a Message Batch needs its requests again; they are not kept")
        payload = b'{"requests":[' + b",".join(line.rstrip(b"\n") for line in lines) + b"]}"

        async def once() -> dict[str, Any]:
            return await self.call("POST", self._url, payload=payload, tries=1)

        batch = await self.create_once(once, tags, lines=len(lines))
        self.known.add(str(batch["id"]))
        return batch

    async def retrieve(self, batch_id: str) -> dict[str, Any]:
        self.known.add(batch_id)
        return await self.call("GET", f"{self._url}/{batch_id}")

    def status(self, batch: Mapping[str, Any]) -> str:
        return str(batch.get("processing_status"))

    def ended(self, batch: Mapping[str, Any]) -> bool:
        return batch.get("processing_status") == "ended"

    def progress(self, batch: Mapping[str, Any]) -> tuple[int, int] | None:
        counts = batch.get("request_counts")
        if not isinstance(counts, dict):
            return None
        total = sum(v for v in counts.values() if isinstance(v, int))
        processing = counts.get("processing")
        return (total - processing, total) if total and isinstance(processing, int) else None

    async def find(self, tags: Mapping[str, str], *, since: float, lines: int) -> dict[str, Any] | None:
        fits: list[dict[str, Any]] = []
        after: str | None = None
        while True:
            page = await self.call("GET", f"{self._url}?limit=100" + (f"&after_id={after}" if after else ""))
            data = [b for b in page.get("data") or [] if isinstance(b, dict)]
            for batch in data:
                counts = batch.get("request_counts") or {}
                total = sum(int(v) for v in counts.values() if isinstance(v, int))
                created = _timestamp(batch.get("created_at"))
                if (
                    since - 5 <= created <= since + _CREATE_WINDOW
                    and total == lines
                    and not self.ended(batch)
                    and str(batch.get("id")) not in self.known
                ):
                    fits.append(batch)
            oldest = _timestamp(data[-1].get("created_at")) if data else 0.0
            if not page.get("has_more") or not data or oldest < since - 60:
                break
            after = str(data[-1]["id"])
        if len(fits) != 1:
            return None
        self.known.add(str(fits[0]["id"]))
        return fits[0]

    async def results(self, batch: Mapping[str, Any]) -> AsyncIterator[Outcome]:
        async for line in self.stream_lines(f"{self._url}/{batch['id']}/results"):
            try:
                item = _json.loads(line)
            except ValueError:
                continue
            if isinstance(item, Mapping) and isinstance(item.get("custom_id"), str):
                result = item.get("result")
                ok = isinstance(result, Mapping) and result.get("type") == "succeeded"
                yield str(item["custom_id"]), ok, line, item

    async def cancel(self, batch_id: str) -> dict[str, Any]:
        return await self.call("POST", f"{self._url}/{batch_id}/cancel")

    def reply(self, batch_id: str, line: bytes) -> Reply:
        label = self.deployment.label
        try:
            result = _json.loads(line)["result"]
            kind = result["type"]
        except (ValueError, KeyError, TypeError):
            raise MalformedResponseError(f"{label}: batch {batch_id} gave a line without a result") from None
        if kind == "succeeded":
            return self.provider.reply_of(_json.dumps(result.get("message") or {}), None, None, self.deployment)
        if kind == "errored":
            error = result.get("error") or {}
            inner = error.get("error") if isinstance(error, Mapping) else None
            error_type = inner.get("type") if isinstance(inner, Mapping) else None
            status = ERROR_STATUS.get(str(error_type), 500)  # a batch line's error has no status
            raise self.provider.error_of(status, _json.dumps(error), {}, None, None, self.deployment)
        raise BatchIncompleteError(f"batch {batch_id} did not answer this line ({kind})")


def _timestamp(value: object) -> float:
    if not isinstance(value, str):
        return 0.0
    try:
        return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0
