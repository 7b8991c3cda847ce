"""What the chat and embeddings handlers share: the server's state, model names, the way a
request is admitted (a client's own limits, the bounded queue), and sluice's errors as
OpenAI's.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

from aiohttp import web

from ..._errors import (
    AttemptTimeoutError,
    AuthenticationError,
    BudgetExhaustedError,
    CancelledError,
    CapacityError,
    ConnectError,
    DeadlineExceededError,
    EngineClosedError,
    InvalidOutputError,
    InvalidRequestError,
    MalformedResponseError,
    NotFoundError,
    PermissionDeniedError,
    ProviderError,
    RateLimitError,
    SluiceError,
)
from ..._pricing import effective_base_url
from ._clients import Client, Clients
from ._errors import openai_error, plain, upstream_auth_failed
from ._keys import CLIENT, ClientLike
from ._queue import Admission, QueueFull, WaitTooLong, estimate
from ._settings import ServeSettings

if TYPE_CHECKING:
    from ..._engine import Engine
    from ..._models import Deployment
    from ._metrics import Metrics
    from ._prompt_cache import ServePromptCache
    from ._redis import ServeRedis

__all__ = ["CONTEXT", "BadBody", "Refused", "ServeContext", "error_for"]

T = TypeVar("T")

_log = logging.getLogger("sluice.serve")

#: ``x-sluice-max-wait: SECONDS``: a client may ask to wait less than ``[serve] max_wait_s``.
MAX_WAIT_HEADER = "x-sluice-max-wait"

_URL = re.compile(r"\b(?:https?|wss?)://[^\s'\"<>]+", re.IGNORECASE)


class BadBody(Exception):
    """The request body is not what the endpoint takes; ``param`` names the field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class Refused(Exception):
    """A request refused before it reached the engine: ``response`` says why."""

    def __init__(self, response: web.Response) -> None:
        super().__init__("refused")
        self.response = response


@dataclass(eq=False, slots=True)
class ServeContext:
    engine: Engine
    clients: Clients
    settings: ServeSettings
    admission: Admission
    metrics: Metrics
    #: Every name a request may use for a model -> the name the engine knows it by.
    models: Mapping[str, str]
    #: Upstream URLs and hosts (longest first): never shown to a client.
    secrets: tuple[str, ...]
    #: ``--redis``: limits, budgets and client spend shared with the other replicas.
    redis: ServeRedis | None = None
    #: ``[serve] prompt_cache``: requests marked for the providers' caches, answers counted.
    prompt_cache: ServePromptCache | None = None

    # -- models -----------------------------------------------------------------------------

    def resolve(self, client: Client, model: Any) -> str:
        """The engine's name for ``model`` if this client may use it; else a Refused 404."""
        if not isinstance(model, str) or not model:
            raise BadBody("you must provide a model parameter", "model")
        name = self.models.get(model)
        if name is not None and client.models is not None:
            allowed = {self.models.get(m, m) for m in client.models}
            if name not in allowed and model not in client.models:
                name = None
        if name is None:
            raise Refused(
                openai_error(
                    404,
                    f"The model `{_clip(model)}` does not exist or you do not have access to it.",
                    code="model_not_found",
                    param="model",
                )
            )
        return name

    def visible_models(self, client: Client) -> list[str]:
        names = sorted(self.models)
        if client.models is None:
            return names
        allowed = {self.models.get(m, m) for m in client.models}
        return [n for n in names if self.models[n] in allowed or n in client.models]

    # -- admission --------------------------------------------------------------------------

    def max_wait(self, request: web.Request) -> float:
        value = request.headers.get(MAX_WAIT_HEADER)
        limit = self.settings.max_wait_s
        if value is None:
            return limit
        try:
            asked = float(value)
        except ValueError:
            raise BadBody(f"header {MAX_WAIT_HEADER} must be a number of seconds, got {_clip(value)!r}") from None
        if not math.isfinite(asked) or asked < 0:
            raise BadBody(f"header {MAX_WAIT_HEADER} must be a number of seconds >= 0, got {_clip(value)!r}")
        return min(asked, limit)

    def estimated_tokens(self, model: str, make_tokens: Callable[[Deployment], int]) -> tuple[int, list[Any]]:
        """The request's token estimate (as its first deployment counts it) and the
        limiters of the deployments it may go to."""
        routes = [route for group in self.engine.router.chain(model)[:1] for route in group.routes]
        tokens = make_tokens(routes[0].deployment) if routes else 0
        return tokens, [route.limiter for route in routes]

    def _latency(self) -> float | None:
        return self.engine.stats.latency.percentile(50)

    async def admit(
        self,
        client: Client,
        request: web.Request,
        tokens: int,
        limiters: Iterable[Any],
        make: Callable[[], Coroutine[Any, Any, T]],
        used: Callable[[T], int | None] | None = None,
    ) -> T:
        """Run ``make()`` through the client's own limiter and the bounded queue.

        Refused (429 with Retry-After) when the queue is full, or when the wait for
        capacity would pass or passes the request's max wait. ``used(outcome)`` says the
        tokens it really took from the client's tpm (None: nothing was sent, so the
        request and its tokens go back to the client's quota; 0: unknown, the estimate stays)."""
        found = list(limiters)
        max_wait = self.max_wait(request)

        def engine_eta() -> float:
            return estimate(found, tokens, self._latency())

        try:
            return await self._run(client, tokens, found, make, used, max_wait, engine_eta)
        except (QueueFull, WaitTooLong) as exc:
            raise self._refusal(client, exc, max_wait) from None

    async def _run(
        self,
        client: Client,
        tokens: int,
        limiters: list[Any],
        make: Callable[[], Coroutine[Any, Any, T]],
        used: Callable[[T], int | None] | None,
        max_wait: float,
        engine_eta: Callable[[], float],
    ) -> T:
        admission = self.admission
        began = _now()
        grant: Any = None  # a local or a shared limiter's reservation
        try:
            admission.check_room(engine_eta)
            grant = await self._client_grant(client, tokens, max_wait)
            remaining = max(0.0, max_wait - (_now() - began))
            if not _has_room(limiters, tokens):
                ahead = engine_eta()
                if ahead > remaining:
                    raise WaitTooLong(ahead, 0.0)
            outcome = await admission.run(make, max_wait=remaining, retry_after=engine_eta)
        except BaseException:
            if grant is not None:
                grant.refund()  # refused or failed before the engine sent it: not the client's to count
            raise
        if grant is not None and used is not None:
            actual = used(outcome)
            if actual is None:
                grant.refund()
            elif actual > 0:  # 0: the provider reported no usage; the estimate stands
                grant.reconcile(actual)
        return outcome

    async def _client_grant(self, client: Client, tokens: int, max_wait: float) -> Any:
        """The client's own rpm/tpm let the request go (None: it has none); a Refused 429
        when that would take longer than ``max_wait``."""
        if client.limiter is None:
            return None
        grant: Any  # a local or a shared limiter's reservation
        try:
            grant = client.limiter.try_acquire(tokens)
        except CapacityError:
            raise BadBody(
                f"this request's ~{tokens} tokens exceed client {client.name!r}'s tpm; send a smaller request"
            ) from None
        if grant is None:
            limiter = client.limiter
            client_eta = limiter.eta(tokens, limiter.waiting, self._latency())
            if client_eta > max_wait:
                raise self._redis_down(client) or _client_limited(client, client_eta, self.metrics)
            try:
                grant = await self.admission.wait_for(
                    limiter.acquire(tokens), max_wait=max_wait, retry_after=lambda: limiter.eta(tokens, 0, None)
                )
            except WaitTooLong as exc:
                raise self._redis_down(client) or _client_limited(client, exc.retry_after, self.metrics) from None
        grant.done()  # a quota of requests and tokens per minute, not of requests in flight
        return grant

    async def admit_client(self, client: Client, request: web.Request) -> None:
        """A request no deployment is sent (sluice answers it itself) counted as one
        request of the client's rpm, none of its tpm: a Refused 429 past its max wait."""
        try:
            await self._client_grant(client, 0, self.max_wait(request))
        except (QueueFull, WaitTooLong) as exc:
            raise self._refusal(client, exc, self.max_wait(request)) from None

    def _redis_down(self, client: Client) -> Refused | None:
        """A 503 naming the problem when Redis cannot be reached (the wait was for it)."""
        problem = self.redis.problem if self.redis is not None else None
        if problem is None:
            return None
        self.metrics.refused.labels(client.name, "redis_down").inc()
        return Refused(
            openai_error(
                503,
                f"sluice cannot admit requests now: {problem}. Retry later; nothing was sent upstream.",
                type="server_error",
                code="shared_state_unavailable",
                headers=_retry_headers(2.0),
            )
        )

    def _refusal(self, client: Client, exc: QueueFull | WaitTooLong, max_wait: float) -> Refused:
        down = self._redis_down(client)
        if down is not None:
            return down
        admission = self.admission
        if isinstance(exc, QueueFull):
            self.metrics.refused.labels(client.name, "queue_full").inc()
            return Refused(
                _too_many(
                    f"sluice's queue is full ({admission.max_queue} requests waiting for capacity); "
                    f"retry after {exc.retry_after:.1f} s",
                    exc.retry_after,
                )
            )
        self.metrics.refused.labels(client.name, "max_wait").inc()
        return Refused(
            _too_many(
                f"the deployments' rate limits would keep this request waiting longer than its maximum wait "
                f"({max_wait:g} s); retry after {exc.retry_after:.1f} s",
                exc.retry_after,
            )
        )

    # -- errors -----------------------------------------------------------------------------

    def scrub(self, text: str) -> str:
        """``text`` without any upstream URL or host, or bidi control."""
        for secret in self.secrets:
            text = text.replace(secret, "<upstream>")
        return plain(_URL.sub("<upstream>", text))

    def failure(self, client: ClientLike, error: SluiceError) -> web.Response:
        """An engine error as OpenAI would send it (status, type, code), scrubbed."""
        status, type_, code = error_for(error)
        headers = None
        if status == 429 and isinstance(error, RateLimitError) and error.retry_after is not None:
            headers = _retry_headers(error.retry_after)
        if isinstance(error, BudgetExhaustedError):
            self.metrics.refused.labels(client.name, "budget").inc()
            reason = error.message.split("; rerun with", 1)[0]  # the batch command's advice is not the client's
            message = (
                f"You exceeded your current quota: {reason}. "
                "Ask the server's operator to raise this client's budget_usd."
            )
        elif isinstance(error, (AuthenticationError, PermissionDeniedError)):
            _log.warning("sluice serve: upstream refused the server's own key: %s", error.message)
            message = upstream_auth_failed(error.status)
        elif isinstance(error, ProviderError):
            message = f"upstream: {error.message}"
        else:
            message = error.message
        return openai_error(status, self.scrub(message), type=type_, code=code, headers=headers)


def error_for(error: SluiceError) -> tuple[int, str, str | None]:
    """(HTTP status, OpenAI error type, code) for a sluice error."""
    if isinstance(error, BudgetExhaustedError):
        return 429, "insufficient_quota", "insufficient_quota"
    if isinstance(error, RateLimitError):
        return 429, "requests", "rate_limit_exceeded"
    if isinstance(error, (AttemptTimeoutError, DeadlineExceededError)):
        return 504, "server_error", "timeout"
    if isinstance(error, (ConnectError, MalformedResponseError)):
        return 502, "server_error", "bad_gateway"
    if isinstance(error, (AuthenticationError, PermissionDeniedError)):
        # The provider refused *the server's* key: a 401 would tell the client its own key
        # is wrong (the SDKs raise AuthenticationError). It is a gateway failure.
        return 502, "server_error", "upstream_auth_failed"
    if isinstance(error, NotFoundError):
        return 404, "invalid_request_error", error.provider_type or "model_not_found"
    if isinstance(error, ProviderError) and error.status is not None:
        type_ = "invalid_request_error" if error.status < 500 else "server_error"
        return error.status, type_, error.provider_type
    if isinstance(error, ProviderError):
        return 502, "server_error", error.provider_type
    if isinstance(error, InvalidRequestError):
        return 400, "invalid_request_error", error.kind
    if isinstance(error, InvalidOutputError):  # upstream answered, but not in the client's schema
        return 502, "server_error", error.kind
    if isinstance(error, (CancelledError, EngineClosedError)):
        return 503, "server_error", "unavailable"
    return 500, "server_error", error.kind


def _has_room(limiters: Iterable[Any], tokens: int) -> bool:
    """Whether some deployment could grant at once (nobody waiting, room now)."""
    import asyncio

    now = asyncio.get_running_loop().time()
    for limiter in limiters:
        ready = getattr(limiter, "_ready_at", None)
        if ready is not None and not limiter.waiting and ready(tokens, now) <= now:
            return True
    return False


def _now() -> float:
    import asyncio

    return asyncio.get_running_loop().time()


def _retry_headers(seconds: float) -> dict[str, str]:
    seconds = max(0.0, seconds)
    return {"retry-after": str(max(1, math.ceil(seconds))), "retry-after-ms": str(max(1, math.ceil(seconds * 1000)))}


def _too_many(message: str, retry_after: float) -> web.Response:
    return openai_error(429, message, type="requests", code="rate_limit_exceeded", headers=_retry_headers(retry_after))


def _client_limited(client: Client, retry_after: float, metrics: Metrics) -> Refused:
    metrics.refused.labels(client.name, "client_rate_limit").inc()
    return Refused(
        _too_many(
            f"Rate limit reached for client {client.name!r} (its own rpm/tpm); retry after {retry_after:.1f} s",
            retry_after,
        )
    )


def upstream_secrets(deployments: Iterable[Deployment]) -> tuple[str, ...]:
    """Each deployment's URL, its host:port and host, longest first (so a URL goes whole)."""
    found: set[str] = set()
    for d in deployments:
        url = effective_base_url(d)
        if not url:
            continue
        found.add(url.rstrip("/"))
        parts = urlsplit(url)
        if parts.netloc:
            found.add(parts.netloc)
        if parts.hostname and len(parts.hostname) > 3:
            found.add(parts.hostname)
    return tuple(sorted(found, key=len, reverse=True))


def _clip(text: str, limit: int = 100) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


#: ``app[CONTEXT]``: the server's shared state (see :class:`ServeContext`).
CONTEXT: web.AppKey[ServeContext] = web.AppKey("sluice.serve.context", ServeContext)
#: ``request[JSON_BODY]``: the parsed JSON body, for the chat and embeddings handlers.
JSON_BODY: web.RequestKey[Any] = web.RequestKey("sluice.serve.json")


def client_of(request: web.Request) -> Client:
    """``request[CLIENT]`` as the auth middleware set it."""
    client = request[CLIENT]
    assert isinstance(client, Client)
    return client
