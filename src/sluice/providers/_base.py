"""What every provider does: estimate a request's tokens and send it, returning a Reply.

A provider raises a :class:`~sluice.ProviderError` subclass for a failed attempt; the
engine decides about retries. Providers are stateless apart from caches, so one
instance serves every deployment of its kind.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeGuard, runtime_checkable

from .._fastinit import fast_frozen_init, maker
from .._limits import RateLimitSnapshot
from .._models import Deployment, Request, Usage
from .._tokens import estimate_message_tokens
from ..structured._ask import sent_params

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["Provider", "Reply", "estimate_request_tokens", "make_reply", "max_output_tokens"]


@fast_frozen_init
@dataclass(frozen=True, slots=True)
class Reply:
    """A successful answer, already parsed."""

    text: str | None
    usage: Usage
    raw: Mapping[str, Any] | None = None
    finish_reason: str | None = None
    request_id: str | None = None
    ratelimit: RateLimitSnapshot | None = None
    #: The provider batch that answered it (the Batch API tier).
    batch_id: str | None = None
    #: Read back from where an earlier send's answer was kept (a provider batch's results
    #: in the state): nothing was sent for it now.
    read_back: bool = False


#: ``Reply(...)`` without ``type.__call__``'s keyword dict (see ``_fastinit.maker``): every
#: answer makes one or two.
make_reply = maker(Reply)


@runtime_checkable
class Provider(Protocol):
    """A way to send a :class:`Request` to a :class:`Deployment`."""

    name: str

    def estimate_tokens(self, request: Request, deployment: Deployment) -> int:
        """Tokens the provider will count against TPM at admission (prompt + max output)."""
        ...

    async def send(self, request: Request, deployment: Deployment, *, idempotency_key: str | None = None) -> Reply:
        """One attempt. Raises a ProviderError subclass on failure; the engine times it.

        ``idempotency_key`` is the same for every attempt of one logical request; HTTP
        providers send it as ``Idempotency-Key`` so a server (or a log) can tell a retry
        from a new request.
        """
        ...

    async def aclose(self) -> None:
        """Release connections."""
        ...


#: Every output cap a request body may carry; which one a server honours varies (and
#: ``params`` are merged over the request's own cap), so the worst case takes the largest.
_OUTPUT_CAPS = ("max_tokens", "max_completion_tokens", "max_output_tokens")


def _positive_int(value: object) -> TypeGuard[int]:
    return type(value) is int and value > 0  # not a bool (its type is bool), nor an int subclass


def max_output_tokens(request: Request, deployment: Deployment) -> int:
    """The most output a request may produce: the largest of every cap it carries
    (``Request.max_tokens``; ``max_tokens``, ``max_completion_tokens`` and
    ``max_output_tokens`` in ``params``), else the deployment's ``default_max_tokens``,
    times ``params["n"]`` choices."""
    params = request.params
    if not params:  # the common case: the request's own cap, or the deployment's default
        cap = request.max_tokens  # _positive_int, inlined: this runs twice a request
        return cap if type(cap) is int and cap > 0 else deployment.default_max_tokens
    caps = [value for value in (request.max_tokens, *map(params.get, _OUTPUT_CAPS)) if _positive_int(value)]
    cap = max(caps) if caps else deployment.default_max_tokens
    choices = params.get("n", 1)
    return cap * (choices if _positive_int(choices) else 1)


def estimate_request_tokens(request: Request, deployment: Deployment) -> int:
    """Prompt estimate + the output the request may produce, as providers reserve it
    against a TPM limit (the ~4-characters estimate: providers count TPM from
    characters; a budget's worst case uses ``_tokens.max_prompt_tokens`` instead)."""
    return estimate_message_tokens(request.messages, sent_params(request)) + max_output_tokens(request, deployment)
