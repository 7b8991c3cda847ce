"""Wrap any ``async`` function as a provider: a local model, a test double, another SDK.

The function receives the :class:`~sluice.Request` and returns the reply text, or a
:class:`Reply` for full control of usage. It may raise sluice errors to signal retry
semantics (``RateLimitError(retry_after=2.0)``); other exceptions are classified:
timeouts and connection errors retry, anything else fails the request.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from .._errors import AttemptTimeoutError, ConnectError, FatalProviderError, SluiceError
from .._models import Deployment, Request, Usage
from .._tokens import estimate_message_tokens, estimate_text_tokens
from ._base import Reply, estimate_request_tokens

__all__ = ["CallableProvider"]

ReplyFunction = Callable[[Request], Awaitable["str | Reply"]]


class CallableProvider:
    """A provider backed by ``fn(request) -> str | Reply`` (async)."""

    def __init__(self, fn: ReplyFunction, *, name: str = "callable") -> None:
        if not callable(fn):
            raise TypeError(f"CallableProvider needs an async function, got {type(fn).__name__}")
        self._fn = fn
        self.name = name

    def estimate_tokens(self, request: Request, deployment: Deployment) -> int:
        return estimate_request_tokens(request, deployment)

    async def send(self, request: Request, deployment: Deployment, *, idempotency_key: str | None = None) -> Reply:
        try:
            answer: Any = await self._fn(request)
        except SluiceError:
            raise
        except TimeoutError:
            raise AttemptTimeoutError(f"{self.name} raised TimeoutError") from None
        except ConnectionError as exc:
            raise ConnectError(f"{self.name}: {type(exc).__name__}: {exc}") from exc
        except Exception as exc:
            raise FatalProviderError(f"{self.name} raised {type(exc).__name__}: {exc}") from exc
        if isinstance(answer, Reply):
            return answer
        if isinstance(answer, str):
            usage = Usage(
                input_tokens=estimate_message_tokens(request.messages, request.params),
                output_tokens=estimate_text_tokens(answer),
            )
            return Reply(text=answer, usage=usage, finish_reason="stop")
        raise FatalProviderError(
            f"{self.name} returned {type(answer).__name__}; return a str or a sluice.providers.Reply"
        )

    async def aclose(self) -> None:
        """Nothing to release."""

    def __repr__(self) -> str:
        return f"<CallableProvider {self.name}>"
