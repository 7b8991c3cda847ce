"""What every shape's translation shares: its error and its result."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["ChatView", "ShapeError"]


class ShapeError(ValueError):
    """A body that is not what its API takes: ``param`` names the field (``messages[2].content``);
    ``code``, when given, is the API's own machine-readable code (OpenAI's ``invalid_type``...)."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


@dataclass(frozen=True, slots=True)
class ChatView:
    """A request of another API in the common (Chat Completions) shape.

    ``body`` is a Chat Completions body (``model``, ``messages``, ``max_tokens``,
    ``temperature`` and any further parameter). ``lost`` says, one entry per thing, what
    of the original a Chat Completions deployment cannot be told (a server tool, a
    citation setting...): such a request may only go to a deployment that speaks the
    original API, and any other refuses it with these words.
    """

    body: dict[str, Any]
    lost: tuple[str, ...] = field(default=())
