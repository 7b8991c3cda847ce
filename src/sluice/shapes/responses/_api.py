"""OpenAI's Responses API served from Chat Completions answers: the whole of it, in one place.

Read a create body with :func:`chat_from_responses`, answer it with
:func:`response_from_chat` (or stream it with :class:`ResponsesEvents`), and keep
:func:`conversation_items` under the response's id for a later ``previous_response_id``.
"""

from __future__ import annotations

from ._answer import conversation_items, new_id, response_from_chat
from ._request import chat_from_responses
from ._stream import ResponsesEvents

__all__ = ["ResponsesEvents", "chat_from_responses", "conversation_items", "new_id", "response_from_chat"]
