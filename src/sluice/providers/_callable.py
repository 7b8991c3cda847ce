"""Wrap any ``async`` function as a provider: a local model, a test double, another SDK.

The function receives the :class:`~sluice.Request` and returns the reply text, or a
:class:`Reply` for full control of usage. It may raise sluice errors to signal retry
semantics (``RateLimitError(retry_after=2.0)``); other exceptions are classified:
timeouts and connection errors retry, anything else fails the request.

An ``async def`` *generator* streams: it yields the text piece by piece (``str``), or
stream events (:class:`~sluice.providers.TextDelta`, ``ToolCallDelta``, ``UsageUpdate``,
``Finish``) for full control. ``Engine.stream()`` passes the pieces on as they come;
``send()`` joins them. A plain function streams as one piece.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from .._errors import AttemptTimeoutError, ConnectError, FatalProviderError, SluiceError
from .._models import Deployment, Request, Usage
from .._tokens import estimate_message_tokens, estimate_text_tokens
from ._base import Reply, estimate_request_tokens
from ._events import Finish, StreamEvent, StreamStart, TextDelta, ToolCallDelta, UsageUpdate, reply_events

__all__ = ["CallableProvider"]

ReplyFunction = Callable[[Request], Awaitable["str | Reply"]] | Callable[[Request], AsyncIterator["str | StreamEvent"]]


class CallableProvider:
    """A provider backed by ``fn(request) -> str | Reply`` (async), or an async generator
    of text pieces / stream events."""

    def __init__(self, fn: ReplyFunction, *, name: str = "callable") -> None:
        if not callable(fn):
            raise TypeError(f"CallableProvider needs an async function, got {type(fn).__name__}")
        self._fn = fn
        self._streams = inspect.isasyncgenfunction(fn)
        self.name = name

    def estimate_tokens(self, request: Request, deployment: Deployment) -> int:
        return estimate_request_tokens(request, deployment)

    async def send(self, request: Request, deployment: Deployment, *, idempotency_key: str | None = None) -> Reply:
        if self._streams:
            return await self._joined(request, deployment)
        try:
            answer: Any = await self._fn(request)  # type: ignore[misc]
        except SluiceError:
            raise
        except Exception as exc:
            raise self._classify(exc) from exc
        if isinstance(answer, Reply):
            return answer
        if isinstance(answer, str):
            return Reply(text=answer, usage=self._estimate(request, answer), finish_reason="stop")
        raise FatalProviderError(
            f"{self.name} returned {type(answer).__name__}; return a str or a sluice.providers.Reply"
        )

    async def stream(
        self, request: Request, deployment: Deployment, *, idempotency_key: str | None = None
    ) -> AsyncIterator[StreamEvent]:
        if not self._streams:
            for event in reply_events(await self.send(request, deployment)):
                yield event
            return
        yield StreamStart()
        text: list[str] = []
        usage: Usage | None = None
        finished = False
        pieces: AsyncIterator[Any] = self._fn(request)  # type: ignore[assignment]
        try:
            async for piece in pieces:
                event = self._event(piece)
                if isinstance(event, TextDelta):
                    text.append(event.text)
                elif isinstance(event, UsageUpdate):
                    usage = event.usage
                elif isinstance(event, Finish):
                    finished = True
                yield event
        except SluiceError:
            raise
        except Exception as exc:
            raise self._classify(exc) from exc
        finally:
            aclose = getattr(pieces, "aclose", None)
            if aclose is not None:
                await aclose()
        if usage is None:
            yield UsageUpdate(self._estimate(request, "".join(text)))
        if not finished:
            yield Finish("stop")

    async def _joined(self, request: Request, deployment: Deployment) -> Reply:
        """A streaming function's pieces as one reply."""
        text: list[str] = []
        usage: Usage | None = None
        finish: str | None = "stop"
        async for event in self.stream(request, deployment):
            if isinstance(event, TextDelta):
                text.append(event.text)
            elif isinstance(event, UsageUpdate):
                usage = event.usage
            elif isinstance(event, Finish):
                finish = event.reason
        joined = "".join(text)
        return Reply(text=joined, usage=usage or self._estimate(request, joined), finish_reason=finish)

    def _event(self, piece: Any) -> StreamEvent:
        if isinstance(piece, str):
            return TextDelta(piece)
        if isinstance(piece, TextDelta | ToolCallDelta | UsageUpdate | Finish):
            return piece
        raise FatalProviderError(
            f"{self.name} yielded {type(piece).__name__}; yield str, TextDelta, ToolCallDelta, UsageUpdate or Finish"
        )

    def _classify(self, exc: Exception) -> SluiceError:
        if isinstance(exc, TimeoutError):
            return AttemptTimeoutError(f"{self.name} raised TimeoutError")
        if isinstance(exc, ConnectionError):
            return ConnectError(f"{self.name}: {type(exc).__name__}: {exc}")
        return FatalProviderError(f"{self.name} raised {type(exc).__name__}: {exc}")

    @staticmethod
    def _estimate(request: Request, answer: str) -> Usage:
        return Usage(
            input_tokens=estimate_message_tokens(request.messages, request.params),
            output_tokens=estimate_text_tokens(answer),
        )

    async def aclose(self) -> None:
        """Nothing to release."""

    def __repr__(self) -> str:
        return f"<CallableProvider {self.name}>"
