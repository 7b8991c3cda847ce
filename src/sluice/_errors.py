"""The exceptions sluice raises or records, all under one root.

::

    SluiceError
    ├── ConfigError                  a deployment or engine setting is wrong
    ├── InvalidRequestError          refused before anything was sent
    │   ├── InvalidInputError        a line of an input file is not a request
    │   └── CapacityError            can never fit the deployment's limits
    ├── EngineClosedError            the engine is closed or closing
    ├── CancelledError               the job was cancelled before it finished
    ├── DeadlineExceededError        its total deadline passed before it could be sent
    ├── BudgetExhaustedError         not run: its worst case no longer fits the budget
    ├── UnknownPriceError            a budgeted run met a model with no known price
    ├── StoreError                   the state file cannot be written (disk full, read-only...)
    ├── GroupExhausted               every deployment of a model is cooling or failed the request
    ├── EmbeddingError               embed() could not give every text a vector
    ├── InvalidOutputError           the answer did not match its schema, after its re-asks
    └── ProviderError                the provider (or the way to it) failed
        ├── RetryableError           worth another attempt
        │   ├── RateLimitError           429
        │   ├── FlexUnavailableError     429 "resource unavailable": no flex capacity for it now
        │   ├── OverloadedError          529 / "overloaded"
        │   ├── ServerError              5xx, 408, 409
        │   ├── AttemptTimeoutError      no answer within the attempt timeout
        │   ├── ConnectError             connection refused / reset / closed
        │   └── MalformedResponseError   a body that is not what the API returns
        └── FatalProviderError       retrying cannot help
            ├── BadRequestError          400, 413, 422
            ├── AuthenticationError      401
            ├── PermissionDeniedError    403
            └── NotFoundError            404

A :class:`ProviderError` carries the HTTP status, the provider's request id and the
provider's own error type, so a person can act on it (and quote it to support).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._embeddings import EmbeddingResult
    from ._limits import RateLimitSnapshot

__all__ = [
    "AttemptTimeoutError",
    "AuthenticationError",
    "BadRequestError",
    "BatchIncompleteError",
    "BatchResultsLostError",
    "BudgetExhaustedError",
    "CancelledError",
    "CapacityError",
    "ConfigError",
    "ConnectError",
    "EmbeddingError",
    "EngineClosedError",
    "FatalProviderError",
    "FlexUnavailableError",
    "GroupExhausted",
    "InvalidInputError",
    "InvalidOutputError",
    "InvalidRequestError",
    "MalformedResponseError",
    "MovedToSyncError",
    "NotFoundError",
    "OverloadedError",
    "ParkedError",
    "PermissionDeniedError",
    "ProviderError",
    "RateLimitError",
    "RetryableError",
    "ServerError",
    "SluiceError",
    "StoreError",
    "UnknownPriceError",
    "error_for_status",
]


class SluiceError(Exception):
    """Root of every error sluice raises or records in a :class:`~sluice.Result`."""

    #: A short stable name for reports and JSON output ("rate_limited", "bad_request"...).
    kind: str = "error"
    #: A stored failure of this kind is the request's own fault (the provider rejected it
    #: as such): a rerun keeps it instead of sending again, unless told to retry failures.
    #: Every other failure (configuration, keys, connections, the server, money, time) is
    #: redone by a plain rerun.
    kept_on_rerun: bool = False
    #: Read back from where an earlier send's outcome was kept (a provider batch's results
    #: in the state), not the outcome of a send made now: not counted as a request sent.
    read_back: bool = False

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r})"


class ConfigError(SluiceError, ValueError):
    """A setting is wrong (``sluice.toml``, a flag, an ``Engine``/``Deployment`` argument): the
    message names it and what it takes. Raised before anything is sent."""

    kind = "config_error"


class InvalidRequestError(SluiceError, ValueError):
    """The request cannot be sent as it is (no model, a field of the wrong type, text
    that is not valid Unicode): the request's fault, so it is never retried."""

    kind = "invalid_request"


class InvalidInputError(InvalidRequestError):
    """A line (or row) of an input file that cannot become a request; says which and why."""

    kind = "invalid_input"

    def __init__(self, message: str, *, line: int | None = None) -> None:
        super().__init__(message)
        self.line = line


class CapacityError(InvalidRequestError):
    """The request needs more than the deployment can ever grant in one window."""

    kind = "exceeds_capacity"


class EngineClosedError(SluiceError, RuntimeError):
    """The engine was used after it closed (``async with`` left, or ``close()`` called)."""

    kind = "engine_closed"


class CancelledError(SluiceError):
    """Not done: the job or the engine stopped (Ctrl-C, ``--grace`` ran out) before it was
    answered. Never billed unless it was in flight; a rerun sends it."""

    kind = "cancelled"


class ParkedError(SluiceError):
    """Not an outcome yet: the provider holds the request to answer later (a line of a
    provider batch, gathering or created), so it leaves memory, and is asked again once
    that batch has ended (the answer then comes from the journal). The engine keeps its
    worst case reserved on the budget meanwhile and stores nothing."""

    kind = "parked"

    def __init__(self, message: str, *, chunk: int, batch_id: str | None) -> None:
        super().__init__(message)
        #: The number its chunk's lines are parked under, and the provider's batch (None: not created yet).
        self.chunk = chunk
        self.batch_id = batch_id


class DeadlineExceededError(SluiceError):
    """Its deadline (``deadline=`` or ``--deadline``) passed before an answer came; a
    rerun with a later one tries again."""

    kind = "deadline_exceeded"


class BudgetExhaustedError(SluiceError):
    """Not run: its worst-case cost no longer fits the budget. A rerun with more resumes it."""

    kind = "budget_exhausted"


class StoreError(SluiceError):
    """The state file could not be written: the job stops admitting and says why.

    Carries the file and the operating system's (or SQLite's) words for the cause, so a
    person can free space, fix permissions or stop the other process, then rerun.
    """

    kind = "store_error"


class UnknownPriceError(SluiceError):
    """A budgeted run met a model with no known price (set one, or allow unpriced models)."""

    kind = "unknown_price"


class GroupExhausted(SluiceError):
    """Every deployment of the model is cooling down or has failed this request: the
    engine moves it to the next model of its fallbacks."""

    kind = "no_deployment"


class EmbeddingError(SluiceError):
    """``embed()`` could not give every text a vector. ``results`` holds every text's
    :class:`~sluice.EmbeddingResult` in input order (the vectors that were made are there,
    and in the store: a rerun embeds only the failed texts); ``failed`` the ones without."""

    kind = "embedding_failed"

    def __init__(self, message: str, results: list[EmbeddingResult]) -> None:
        super().__init__(message)
        self.results = results

    @property
    def failed(self) -> list[EmbeddingResult]:
        return [r for r in self.results if not r.ok]


class InvalidOutputError(SluiceError):
    """The answer did not match the request's schema, and its re-asks did not mend it.

    ``errors`` says what the validator found in the last answer (the record's ``text``
    holds that answer). Not kept on a rerun: a plain rerun asks again."""

    kind = "invalid_output"

    def __init__(self, message: str, errors: tuple[str, ...] | list[str] = (), generation: int = 0) -> None:
        super().__init__(message)
        self.errors = tuple(errors)
        #: Runs that asked this line and got no valid answer, before this one: a rerun's asks
        #: carry the next number in their Idempotency-Key (the old answers must not come back).
        self.generation = generation


class ProviderError(SluiceError):
    """A failed attempt at the provider; ``retryable`` says whether another may help."""

    kind = "provider_error"
    retryable = False
    billed_by_default = False

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        request_id: str | None = None,
        provider_type: str | None = None,
        retry_after: float | None = None,
        should_retry: bool | None = None,
        maybe_billed: bool | None = None,
    ) -> None:
        parts = [message]
        if status is not None:
            parts.insert(0, f"HTTP {status}:")
        if request_id:
            parts.append(f"(request id {request_id})")
        super().__init__(" ".join(parts))
        self.status = status
        self.request_id = request_id
        self.provider_type = provider_type
        #: Seconds the server asked us to wait (``retry-after-ms`` / ``retry-after``).
        self.retry_after = retry_after
        #: The server's own verdict (``x-should-retry``), which wins over the status.
        self.should_retry = should_retry
        #: What the error response's rate-limit headers said, for the limiter to learn from.
        self.ratelimit: RateLimitSnapshot | None = None
        #: The provider may have done (and billed) the work though we saw no usage: a
        #: timeout, a reset after sending, a garbled 200. A budget charges its worst case.
        self.maybe_billed = type(self).billed_by_default if maybe_billed is None else maybe_billed


class RetryableError(ProviderError):
    """A failed attempt that another may mend (a 429, 5xx, timeout, dropped connection):
    retried with backoff, on the same deployment or another, until its attempts run out."""

    kind = "retryable_error"
    retryable = True


class RateLimitError(RetryableError):
    """429: the provider's rate limit. The deployment pauses for its ``Retry-After`` (or
    what its ``x-ratelimit-*`` headers say) and learns the limit; the request goes again."""

    kind = "rate_limited"


class FlexUnavailableError(RetryableError):
    """OpenAI's flex processing had no capacity for this request (a 429 "resource
    unavailable", not billed): about that request, not the key's rate, so it is tried
    again after its own backoff while the deployment goes on sending the rest."""

    kind = "flex_unavailable"


class OverloadedError(RetryableError):
    """529 (Anthropic's ``overloaded_error``): the provider has no room now; retried after a
    backoff, and repeated ones take the deployment out for a cooldown."""

    kind = "overloaded"


class ServerError(RetryableError):
    """A 5xx (or 408) from the provider: retried after a backoff; repeated ones take the
    deployment out for a cooldown."""

    kind = "server_error"


class AttemptTimeoutError(RetryableError):
    """An attempt took longer than ``attempt_timeout`` (or went ``idle_timeout`` without a
    byte): given up and retried; counted as possibly billed (the provider may finish it)."""

    kind = "timeout"
    billed_by_default = True  # the provider may finish (and bill) what we gave up on


class ConnectError(RetryableError):
    """The connection failed or dropped: retried; possibly billed when it dropped after the
    request was sent."""

    kind = "connection_error"
    billed_by_default = True  # unless it never connected: a reset may come after the work


class BatchIncompleteError(RetryableError):
    """A provider batch ended (expired, cancelled, failed) without answering this line:
    not the request's fault; it is submitted again."""

    kind = "batch_incomplete"


class MalformedResponseError(RetryableError):
    """A 200 whose body is not the API's answer (truncated, not JSON, no choices): retried;
    possibly billed (the provider did the work)."""

    kind = "malformed_response"
    billed_by_default = True  # a garbled or truncated 200 was still a completed request


class FatalProviderError(ProviderError):
    """A failed attempt that sending again cannot mend (a 4xx other than 429): not retried
    on that deployment."""

    kind = "provider_error"


class BatchResultsLostError(FatalProviderError):
    """A provider batch answered this line but its results can no longer be read (the
    file is gone): possibly billed; not sent again by this run (a rerun does it)."""

    kind = "batch_results_lost"
    billed_by_default = True


class MovedToSyncError(FatalProviderError):
    """``--tier auto``: the batch cannot answer this line by the deadline; it goes to the
    model synchronously (the fallback of its batch tier)."""

    kind = "moved_to_sync"


class BadRequestError(FatalProviderError):
    """400/413/422: the provider refused this request itself (413: it is too large, and
    always will be); sending it again cannot help."""

    kind = "bad_request"
    kept_on_rerun = True


class AuthenticationError(FatalProviderError):
    """401: the deployment's API key was refused. Check the variable its ``api_key_env``
    names; other deployments of the model go on."""

    kind = "authentication_error"


class PermissionDeniedError(FatalProviderError):
    """403: the key may not use this model or endpoint (an organisation or project
    setting at the provider)."""

    kind = "permission_denied"


class NotFoundError(FatalProviderError):
    """404: the model or endpoint does not exist at that ``base_url`` (a typo in the model's
    name, or a provider that does not serve it)."""

    kind = "not_found"


_BY_STATUS: dict[int, type[ProviderError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    408: ServerError,
    409: ServerError,
    413: BadRequestError,
    422: BadRequestError,
    429: RateLimitError,
    529: OverloadedError,
}


def error_for_status(status: int) -> type[ProviderError]:
    """The error class for an HTTP status: 429 and 5xx retry, other 4xx do not."""
    cls = _BY_STATUS.get(status)
    if cls is not None:
        return cls
    if status >= 500:
        return ServerError
    return FatalProviderError
