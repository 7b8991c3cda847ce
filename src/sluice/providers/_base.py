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

__all__ = ["Provider", "Reply", "estimate_request_tokens", "max_output_tokens"]


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


def max_output_tokens(request: Request, deployment: Deployment) -> int:
    """The most output a request may produce: its cap (or the deployment's) times ``n`` choices."""
    cap = request.max_tokens
    if cap is None:
        value = request.params.get("max_completion_tokens") or request.params.get("max_tokens")
        cap = value if isinstance(value, int) and value > 0 else deployment.default_max_tokens
    choices = request.params.get("n", 1)
    return cap * (choices if isinstance(choices, int) and choices > 1 else 1)


def estimate_request_tokens(request: Request, deployment: Deployment) -> int:
    """Prompt estimate + the output the request may produce, as providers reserve it."""
    return estimate_message_tokens(request.messages, request.params) + max_output_tokens(request, deployment)
