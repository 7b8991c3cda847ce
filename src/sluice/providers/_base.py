"""What every provider does: estimate a request's tokens and send it, returning a Reply.

A provider raises a :class:`~sluice.ProviderError` subclass for a failed attempt; the
engine decides about retries. Providers are stateless apart from caches, so one
instance serves every deployment of its kind.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from .._limits import RateLimitSnapshot
from .._models import Deployment, Request, Usage
from .._tokens import estimate_message_tokens

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["Provider", "Reply", "estimate_request_tokens"]


@dataclass(frozen=True, slots=True)
class Reply:
    """A successful answer, already parsed."""

    text: str | None
    usage: Usage
    raw: Mapping[str, Any] | None = None
    finish_reason: str | None = None
    request_id: str | None = None
    ratelimit: RateLimitSnapshot | None = None


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


def estimate_request_tokens(request: Request, deployment: Deployment) -> int:
    """Prompt estimate + the output the request may produce, as providers reserve it."""
    prompt = estimate_message_tokens(request.messages, request.params)
    max_output = request.max_tokens
    if max_output is None:
        value = request.params.get("max_completion_tokens") or request.params.get("max_tokens")
        max_output = value if isinstance(value, int) and value > 0 else deployment.default_max_tokens
    return prompt + max_output
