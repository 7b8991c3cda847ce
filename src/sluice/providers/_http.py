"""The shared HTTP machinery: one pooled aiohttp session, and a base for JSON APIs.

aiohttp is imported lazily: ``import sluice`` stays fast, and only an engine that
talks HTTP pays for it. One session (one connection pool) serves every deployment:
on a 2-core machine raw aiohttp did ~7,900 req/s against a fake server where httpx
did ~290 and the openai SDK ~390.

A streamed request (:meth:`HttpProvider.stream`) reads server-sent events off the same
pool; each provider says how its events read (:class:`StreamDecoder`).
"""

from __future__ import annotations

import io
import json
import os
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

from .. import _json
from .._arrival import heard
from .._errors import (
    AttemptTimeoutError,
    ConfigError,
    ConnectError,
    FlexUnavailableError,
    InvalidRequestError,
    MalformedResponseError,
    ProviderError,
    error_for_status,
)
from .._limits import RateLimitSnapshot
from .._models import Deployment, Native, Request, Secret
from .._retry import parse_retry_after, parse_should_retry
from ..structured._ask import shaped
from ._base import Reply, estimate_request_tokens, make_reply
from ._events import StreamEvent, StreamStart, reply_events
from ._read_buffers import raise_mmap_threshold
from ._sse import SseDecoder, SseError, SseEvent

if TYPE_CHECKING:
    import aiohttp

__all__ = ["HttpProvider", "HttpTransport", "StreamDecoder", "header_number", "token_count", "untranslatable"]


def header_number(headers: Mapping[str, str], name: str) -> float | None:
    """A numeric header, or None when absent or unreadable."""
    value = headers.get(name)
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        return None


#: More tokens than any request can have: a count past it is a broken server, not a bill.
MAX_TOKENS_REPORTED = 2**40


def token_count(value: Any) -> int:
    """A token count from a usage object: an int, or 0 when absent or not a number. A
    negative or absurd count raises ValueError (the answer is then a malformed response,
    charged at its worst case): taken at its word it would make the cost negative (a
    budget that grows) or overflow the state file."""
    if type(value) is not int:  # absent, or not a count (a bool's type is bool)
        return 0
    if not 0 <= value < MAX_TOKENS_REPORTED:
        raise ValueError(f"usage reports {value} tokens")
    return value


_AUTH_HEADERS = ("authorization", "x-api-key", "api-key")


def _secrets_in(headers: Mapping[str, str]) -> tuple[str, ...]:
    """The key values in a deployment's auth headers (long enough to be worth masking)."""
    found = []
    for name, value in headers.items():
        if name.lower() in _AUTH_HEADERS:
            secret = value.removeprefix("Bearer ").strip()
            if len(secret) >= 8:
                found.append(secret)
    return tuple(found)


#: aiohttp warns of raw bytes bodies over this (``aiohttp.payload.TOO_LARGE_BYTES_BODY``).
_LARGE_BODY = 1 << 20
#: Each native API's output cap.
_OUTPUT_CAP = {"anthropic": "max_tokens", "responses": "max_output_tokens"}
#: What each native API is called in messages.
_API_NAMES = {"anthropic": "Anthropic's Messages API", "responses": "OpenAI's Responses API"}


def untranslatable(native: Native, deployment: Deployment) -> str:
    """Why a native request cannot go to a deployment of another API, and what to do."""
    api = _API_NAMES.get(native.api, native.api)
    return (
        f"deployment {deployment.label!r} does not speak {api}, and the request cannot be translated for it: "
        f"{'; '.join(native.lost)} (send it to a model served by a deployment of that API, or leave these out)"
    )


class StreamDecoder(Protocol):
    """One provider's streaming format: SSE events in, stream events out."""

    def feed(self, sse: SseEvent) -> list[StreamEvent]:
        """The events one SSE event carries; raises a ProviderError for an error event or
        a malformed one."""
        ...

    def close(self) -> list[StreamEvent]:
        """The stream ended; raises MalformedResponseError if it ended before its end marker."""
        ...


class HttpTransport:
    """One lazily created aiohttp session shared by every HTTP provider of an engine."""

    def __init__(self, *, limit: int = 0, idle_timeout: float | None = None) -> None:
        self._limit = limit
        self.idle_timeout = idle_timeout
        self._session: aiohttp.ClientSession | None = None
        #: What a round trip can fail with that :meth:`failure` maps (aiohttp's errors once
        #: the session, and with it aiohttp, is there: no import statement per request).
        self.failures: tuple[type[BaseException], ...] = (TimeoutError,)

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            import aiohttp

            raise_mmap_threshold()  # asyncio's 256 KiB read buffers from the heap, not mmap
            self.failures = (TimeoutError, aiohttp.ClientError)
            connector = aiohttp.TCPConnector(limit=self._limit, limit_per_host=0, ttl_dns_cache=300)
            self._session = aiohttp.ClientSession(
                connector=connector,
                json_serialize=json.dumps,
                raise_for_status=False,
                # the engine times each attempt, the idle timeout of a plain request included
                # (an answer sent whole is silent until it is ready): one shared timer, not
                # aiohttp's per-read one, moved on by a slow body (``_read_arriving``); a
                # stream sets its own (``stream_timeout``)
                timeout=aiohttp.ClientTimeout(total=None),
                auto_decompress=True,
            )
        return self._session

    def stream_timeout(self) -> aiohttp.ClientTimeout:
        """A stream's timeout: a socket silent for ``idle_timeout`` between two chunks."""
        import aiohttp

        return aiohttp.ClientTimeout(total=None, sock_read=self.idle_timeout)

    def failure(self, exc: BaseException, label: str, *, streaming: bool = False) -> ProviderError | None:
        """The ProviderError for what went wrong on the way to ``label`` (a socket gone idle,
        a body cut short, a refused or dropped connection), or None if ``exc`` is not the
        transport's. One mapping for plain sends, streams and embeddings requests."""
        import aiohttp

        if isinstance(exc, TimeoutError):  # the idle timeout (aiohttp's sock_read); the engine times attempts
            idle = self.idle_timeout
            return AttemptTimeoutError(
                f"{label} sent nothing for {idle:g} s (idle timeout)"
                if idle is not None
                else f"socket timeout talking to {label}"
            )
        if isinstance(exc, aiohttp.ClientPayloadError):
            if streaming:
                return ConnectError(f"the stream from {label} was cut off: {exc}")
            return MalformedResponseError(f"truncated response body from {label}: {exc}")
        if isinstance(exc, aiohttp.ClientConnectorError):  # never connected: nothing was sent
            return ConnectError(f"cannot connect to {label}: {exc}", maybe_billed=False)
        if isinstance(exc, aiohttp.ClientError):
            return ConnectError(f"{type(exc).__name__} talking to {label}: {exc}")
        return None

    async def aclose(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None


async def _read_arriving(response: aiohttp.ClientResponse) -> bytes:
    """A body still on its way, read piece by piece, each piece telling the attempt's idle
    timer that the answer is not silent (a big body, a gateway's keep-alive whitespace)."""
    heard()  # the headers
    content = response.content
    pieces = []
    while piece := await content.readany():
        heard()
        pieces.append(piece)
    return b"".join(pieces)


def resolve_key(deployment: Deployment, default_env: str | None) -> Secret | None:
    """The API key: given explicitly, or from ``api_key_env``, or the provider's usual variable."""
    if isinstance(deployment.api_key, Secret) and deployment.api_key:
        return deployment.api_key
    env = deployment.api_key_env or default_env
    if env:
        value = os.environ.get(env)
        if value:
            return Secret(value)
        if deployment.api_key_env:
            raise ConfigError(
                f"deployment {deployment.label!r}: the environment variable ${env} (its api_key_env) is not set"
            )
    return None


def missing_key_message(deployment: Deployment, default_env: str, base_url: str | None = None) -> str:
    """What to do about a deployment with no API key: which variable to set, and for a
    server that needs no key (vLLM, Ollama), that it still takes one, as the official
    SDKs require."""
    env = deployment.api_key_env or default_env
    message = f"deployment {deployment.label!r}: no API key; set ${env}"
    if not deployment.api_key_env:
        message += " (or name another variable with api_key_env)"
    host = urlsplit(base_url).hostname if base_url else None
    if host is not None and host != "api.openai.com":
        message += (
            f". A server that needs no key ({host}: vLLM, Ollama, a local proxy) still takes one, "
            f"as with the official SDK: {env}=EMPTY"
        )
    return message


class HttpProvider(ABC):
    """A JSON-over-HTTP chat API. Subclasses say how to build, parse and classify."""

    name = "http"

    def __init__(self, transport: HttpTransport) -> None:
        self._transport = transport
        self._prepared: dict[int, tuple[Deployment, str, Mapping[str, str]]] = {}
        self._secrets: dict[int, tuple[str, ...]] = {}

    # -- what a subclass provides ------------------------------------------------------

    @abstractmethod
    def endpoint(self, deployment: Deployment) -> tuple[str, dict[str, str]]:
        """URL and headers (auth included) for a deployment; computed once per deployment."""

    @abstractmethod
    def build_body(self, request: Request, deployment: Deployment) -> dict[str, Any]:
        """The JSON body of one request."""

    def speaks(self, deployment: Deployment) -> str | None:
        """The API (``Native.api``) whose bodies ``deployment`` is sent as they are, if any."""
        return None

    def api_of(self, request: Request, deployment: Deployment) -> str | None:
        """The API ``request`` goes to ``deployment`` in: its native one when the deployment
        speaks it (the body as the client wrote it), else None (this provider's own)."""
        native = request.native
        return native.api if native is not None and native.api == self.speaks(deployment) else None

    # -- what a native API changes (the URL, the reply's parse, the stream's decoder) --------
    # (``send`` takes a request without a native body to the endpoint, read by parse_reply)

    def url_of(self, request: Request, deployment: Deployment) -> str:
        """The URL ``request`` is sent to: the deployment's endpoint, unless its API has another."""
        return self._endpoint_for(deployment)[0]

    def reply_parser(self, request: Request, deployment: Deployment) -> Callable[[Mapping[str, Any]], Reply]:
        """How the 200 body of ``request`` reads: :meth:`parse_reply`, unless its API answers in another shape."""
        return self.parse_reply

    def decoder_of(self, request: Request, deployment: Deployment, request_id: str | None) -> StreamDecoder:
        """The decoder of ``request``'s stream: :meth:`stream_decoder`, unless its API streams another way."""
        return self.stream_decoder(deployment, request_id)

    def native_body(self, request: Request, deployment: Deployment) -> dict[str, Any]:
        """A native body as the deployment is sent it: its own model name put in (the
        client named sluice's), ``stream`` left to :meth:`stream_body`, and the request's
        output cap where the body gives none (a budget caps every request it prices)."""
        native = request.native
        assert native is not None
        body = {key: value for key, value in native.body.items() if key != "stream"}
        body["model"] = deployment.model_name
        cap = _OUTPUT_CAP[native.api]
        if body.get(cap) is None and request.max_tokens is not None:
            body[cap] = request.max_tokens
        return body

    def body_of(self, request: Request, deployment: Deployment) -> dict[str, Any]:
        """The JSON body of one request as it is sent: a native body as it is to a deployment
        of its API; else its schema, if any, said the way the deployment understands (see
        :mod:`sluice.structured`), then :meth:`build_body` (a native request's translation,
        refused here, before anything is sent, when the translation lost something)."""
        native = request.native
        if native is not None:
            if self.api_of(request, deployment) is not None:
                return self.native_body(request, deployment)
            if native.lost:
                raise InvalidRequestError(untranslatable(native, deployment))
        if request.schema is not None:
            request = shaped(request, deployment)
        return self.build_body(request, deployment)

    @abstractmethod
    def parse_reply(self, body: Mapping[str, Any]) -> Reply:
        """Text and usage from a 200 body; raise MalformedResponseError if it is not one."""

    @abstractmethod
    def parse_error(self, body: Any) -> tuple[str, str | None]:
        """(message, provider error type) from an error body."""

    @abstractmethod
    def parse_ratelimit(self, headers: Mapping[str, str]) -> RateLimitSnapshot | None:
        """What the rate-limit headers say, or None when there are none."""

    request_id_header = "x-request-id"

    # -- the shared part ------------------------------------------------------------------

    def estimate_tokens(self, request: Request, deployment: Deployment) -> int:
        return estimate_request_tokens(request, deployment)

    def check(self, deployment: Deployment) -> None:
        """Raise :class:`ConfigError` now if the deployment cannot be called (no key, no URL)."""
        self._endpoint_for(deployment)

    def _endpoint_for(self, deployment: Deployment) -> tuple[str, Mapping[str, str]]:
        """The deployment's URL and headers, worked out once. The headers are kept as
        aiohttp's own read-only multidict, which it takes as it is: from a dict it would
        build one every request (~0.4 µs)."""
        cached = self._prepared.get(id(deployment))
        if cached is None or cached[0] is not deployment:
            from multidict import CIMultiDict, CIMultiDictProxy  # aiohttp's; here once a deployment

            url, headers = self.endpoint(deployment)
            merged: CIMultiDict[str] = CIMultiDict()
            for name, value in {"content-type": "application/json", **headers, **deployment.headers}.items():
                merged[name] = value  # a later one of the same name (any case) wins, as aiohttp would
            cached = (deployment, url, CIMultiDictProxy(merged))
            self._prepared[id(deployment)] = cached
            self._secrets[id(deployment)] = _secrets_in(merged)
        return cached[1], cached[2]

    def _redact(self, text: str, deployment: Deployment) -> str:
        """Some servers quote the key they were sent in an error message: mask it before the
        message reaches a result, a log, the output or the state."""
        for secret in self._secrets.get(id(deployment), ()):
            text = text.replace(secret, "****")
        return text

    async def post(
        self,
        deployment: Deployment,
        data: bytes | io.BytesIO,
        *,
        url: str | None = None,
        idempotency_key: str | None = None,
    ) -> tuple[bytes, str | None, RateLimitSnapshot | None]:
        """One round trip to ``deployment`` (its endpoint, or ``url``) through the pooled
        session: the 200 body, the provider's request id and what the rate-limit headers
        said. Any other status, and a failure on the way, raise the typed ProviderError."""
        answer = await self._exchange(deployment, data, url, idempotency_key, None)
        assert isinstance(answer, tuple)
        return answer

    def send(
        self, request: Request, deployment: Deployment, *, idempotency_key: str | None = None
    ) -> Coroutine[Any, Any, Reply]:
        """One attempt: the body is built and encoded now (a request that cannot be sent
        raises here, before anything goes out) and the returned coroutine makes the round
        trip and reads the answer: one level of coroutine, not ``send``'s and ``post``'s
        (every level is resumed at each of the round trip's suspensions)."""
        data = self._encode(self.body_of(request, deployment))  # a translation error stays as it is
        # with a parse it makes a Reply (the ignores, not a cast(): that is a call a request)
        if request.native is None:  # this provider's own API: its endpoint, its parse (see url_of)
            return self._exchange(deployment, data, None, idempotency_key, self.parse_reply)  # type: ignore[return-value]
        url = self.url_of(request, deployment)
        return self._exchange(deployment, data, url, idempotency_key, self.reply_parser(request, deployment))  # type: ignore[return-value]

    async def _exchange(
        self,
        deployment: Deployment,
        data: bytes | io.BytesIO,
        url: str | None,
        idempotency_key: str | None,
        parse: Callable[[Mapping[str, Any]], Reply] | None,
    ) -> Reply | tuple[bytes, str | None, RateLimitSnapshot | None]:
        """:meth:`post`'s round trip; with ``parse``, the Reply it reads (:meth:`send`)."""
        endpoint, headers = self._endpoint_for(deployment)
        if idempotency_key is not None:
            headers = {**headers, "idempotency-key": idempotency_key}
        transport = self._transport
        session = transport.session()
        try:
            # never follow a redirect: aiohttp would carry x-api-key / api-key to the new origin
            async with session.post(url or endpoint, data=data, headers=headers, allow_redirects=False) as response:
                if response.content.is_eof():  # the body came with the headers (nearly every answer)
                    payload = await response.read()
                else:
                    payload = await _read_arriving(response)
                status = response.status
                response_headers: Mapping[str, str] = response.headers
        except transport.failures as exc:
            raise transport.failure(exc, deployment.label) or exc from None
        request_id = response_headers.get(self.request_id_header)
        ratelimit = self.parse_ratelimit(response_headers)
        if status != 200:
            raise self.error_of(status, payload, response_headers, request_id, ratelimit, deployment)
        if parse is None:
            return payload, request_id, ratelimit
        return self.reply_of(payload, request_id, ratelimit, deployment, parse=parse)

    def reply_of(
        self,
        payload: bytes,
        request_id: str | None,
        ratelimit: RateLimitSnapshot | None,
        deployment: Deployment,
        *,
        parse: Callable[[Mapping[str, Any]], Reply] | None = None,
    ) -> Reply:
        """The Reply in a 200 body (from a response, or a Batch API's result line), read by
        ``parse`` (the request's :meth:`reply_parser`; :meth:`parse_reply` by default)."""
        try:
            body = _json.loads(payload)
        except ValueError:
            raise MalformedResponseError(
                f"{deployment.label} answered 200 with a body that is not JSON ({len(payload)} bytes)",
                request_id=request_id,
            ) from None
        if type(body) is not dict and not isinstance(body, Mapping):
            raise MalformedResponseError(f"{deployment.label} answered 200 with JSON that is not an object")
        try:
            reply = (parse or self.parse_reply)(body)
        except (AttributeError, KeyError, TypeError, ValueError) as exc:  # a body of the wrong shape
            raise MalformedResponseError(
                f"{deployment.label} answered 200 with an unexpected body ({type(exc).__name__}: {exc})",
                request_id=request_id,
            ) from None
        return make_reply(
            text=reply.text,
            usage=reply.usage,
            raw=body if reply.raw is None else reply.raw,  # a provider may give the common shape
            finish_reason=reply.finish_reason,
            request_id=request_id,
            ratelimit=ratelimit,
        )

    # -- streaming (see _events.py; each provider's format in _openai_stream / _anthropic_stream)

    def stream_body(self, request: Request, deployment: Deployment) -> dict[str, Any]:
        """The JSON body of a streamed request: :meth:`build_body`'s, asking for a stream."""
        body = self.body_of(request, deployment)
        body["stream"] = True
        return body

    def stream_decoder(self, deployment: Deployment, request_id: str | None) -> StreamDecoder:
        """A decoder for one response of this provider's stream format."""
        raise NotImplementedError(f"{type(self).__name__} cannot stream")

    async def stream(
        self, request: Request, deployment: Deployment, *, idempotency_key: str | None = None
    ) -> AsyncIterator[StreamEvent]:
        """One streamed attempt: a :class:`StreamStart`, then the answer's events as they arrive.

        A non-200 raises the error ``send`` would; a connection cut, an idle socket, an
        error event or a malformed chunk mid-stream raise a (possibly billed) ProviderError.
        Closing the iterator early (``aclose()``) drops the connection, so the provider sees
        the client go; a stream read to its end leaves the connection to the pool.
        """
        import aiohttp

        url = self.url_of(request, deployment)
        headers = {**self._endpoint_for(deployment)[1], "accept": "text/event-stream"}
        if idempotency_key is not None:
            headers["idempotency-key"] = idempotency_key
        data = self._encode(self.stream_body(request, deployment))
        label = deployment.label
        response: aiohttp.ClientResponse | None = None
        whole = False
        try:
            response = await self._transport.session().post(
                url, data=data, headers=headers, allow_redirects=False, timeout=self._transport.stream_timeout()
            )
            request_id = response.headers.get(self.request_id_header)
            ratelimit = self.parse_ratelimit(response.headers)
            if response.status != 200:
                payload = await response.read()
                raise self.error_of(response.status, payload, response.headers, request_id, ratelimit, deployment)
            if not response.content_type.startswith("text/event-stream"):  # a server that ignored "stream"
                parse = self.reply_parser(request, deployment)
                for item in self._unstreamed(await response.read(), request_id, ratelimit, deployment, parse):
                    yield item
                whole = True
                return
            yield StreamStart(request_id, ratelimit)
            decoder = self.decoder_of(request, deployment, request_id)
            sse = SseDecoder()
            async for chunk in response.content.iter_any():
                for event in sse.feed(chunk):
                    for item in decoder.feed(event):
                        yield item
            for event in sse.close():
                for item in decoder.feed(event):
                    yield item
            for item in decoder.close():
                yield item
            whole = True
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise self._transport.failure(exc, label, streaming=True) or exc from None
        except SseError as exc:
            raise MalformedResponseError(f"{label} sent a broken event stream: {exc}") from None
        except ValueError as exc:  # an event of the wrong shape (absurd usage counts...)
            raise MalformedResponseError(f"{label} sent an unexpected event: {exc}") from None
        except ProviderError as exc:  # an error event mid-stream may quote the key too
            exc.message = self._redact(exc.message, deployment)
            exc.args = (exc.message,)
            raise
        finally:
            if response is not None:
                if whole:
                    response.release()  # read to the end: the connection goes back to the pool
                else:
                    response.close()  # left early or broken: drop the connection

    def _encode(self, body: Mapping[str, Any]) -> bytes | io.BytesIO:
        """The body as JSON; over aiohttp's 1 MiB mark (base64 images, long documents) as a
        BytesIO, which aiohttp writes in pieces: raw bytes that large make it warn that they
        may block the loop (a ResourceWarning, an error where warnings are)."""
        try:
            data = _json.dumps(body)
            return io.BytesIO(data) if len(data) > _LARGE_BODY else data
        except UnicodeEncodeError as exc:
            raise InvalidRequestError(f"the request holds text that is not valid Unicode ({exc.reason})") from None
        except (TypeError, ValueError) as exc:
            raise InvalidRequestError(f"the request cannot be sent as JSON: {exc}") from None

    def _unstreamed(
        self,
        payload: bytes,
        request_id: str | None,
        ratelimit: RateLimitSnapshot | None,
        deployment: Deployment,
        parse: Callable[[Mapping[str, Any]], Reply],
    ) -> list[StreamEvent]:
        """A whole JSON answer to a streamed request, as the events of a one-chunk stream."""
        try:
            body = _json.loads(payload)
            if not isinstance(body, Mapping):
                raise TypeError("not a JSON object")
            reply = parse(body)
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise MalformedResponseError(
                f"{deployment.label} answered a stream request with neither events nor an answer "
                f"({type(exc).__name__}: {exc})",
                request_id=request_id,
            ) from None
        return reply_events(Reply(reply.text, reply.usage, body, reply.finish_reason, request_id, ratelimit))

    def url_for(self, deployment: Deployment) -> str:
        """The URL a chat request to ``deployment`` goes to."""
        return self._endpoint_for(deployment)[0]

    def headers_for(self, deployment: Deployment) -> dict[str, str]:
        """The headers every request to ``deployment`` carries (its key among them)."""
        return dict(self._endpoint_for(deployment)[1])

    def error_of(
        self,
        status: int,
        payload: bytes,
        headers: Mapping[str, str],
        request_id: str | None,
        ratelimit: RateLimitSnapshot | None,
        deployment: Deployment,
    ) -> ProviderError:
        try:
            message, provider_type = self.parse_error(_json.loads(payload))
        except ValueError:
            message, provider_type = payload[:200].decode("utf-8", "replace") or "(empty body)", None
        message = self._redact(message, deployment)
        if 300 <= status < 400:
            where = headers.get("location", "somewhere else")
            message = (
                f"redirected to {where}; sluice does not follow redirects (they could carry the API key to "
                "another server): set base_url to where the API really is"
            )
        kind = error_for_status(status)
        if status == 429 and deployment.tier == "flex" and _no_flex_capacity(message, provider_type):
            kind = FlexUnavailableError  # the request's, not the key's: no pause for the deployment
        error = kind(
            message,
            status=status,
            request_id=request_id,
            provider_type=provider_type,
            retry_after=parse_retry_after(headers),
            should_retry=parse_should_retry(headers),
        )
        error.ratelimit = ratelimit
        return error

    async def aclose(self) -> None:  # noqa: B027 - deliberately empty, not abstract
        """Nothing of its own: the engine closes the shared transport."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__}>"


def _no_flex_capacity(message: str, provider_type: str | None) -> bool:
    """Whether a flex request's 429 is OpenAI's "resource unavailable" (no flex capacity
    for it now), not a rate limit."""
    said = f"{provider_type or ''} {message}".lower().replace("_", " ")
    return "resource unavailable" in said
