"""How a request with a schema is put to a deployment, in the way its server understands.

``options = {structured = "..."}`` on a deployment says how (OpenAI-compatible servers
differ; vLLM and Ollama speak ``json_schema``, older ones only ``json_object``):

============= ============================================================================
json_schema   ``response_format: {"type": "json_schema", ...}`` (the default; strict where
              the schema allows). The Anthropic provider turns it into a forced tool whose
              input is the answer, and reads the tool's input back as the text.
json_object   ``response_format: {"type": "json_object"}`` and the schema in a system message
prompt        the schema in a system message only, for a server with no JSON mode
============= ============================================================================

Whichever way it was asked, the answer is validated the same way (:mod:`._check`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .._errors import InvalidRequestError
from .._schema import ASK_MODES

if TYPE_CHECKING:
    from .._models import Deployment, Request
    from .._schema import Schema

__all__ = ["ask_mode", "sent_params", "shaped"]


def ask_mode(deployment: Deployment) -> str:
    mode = deployment.options.get("structured", "json_schema") if isinstance(deployment.options, Mapping) else None
    return mode if isinstance(mode, str) and mode in ASK_MODES else "json_schema"


def shaped(request: Request, deployment: Deployment) -> Request:
    """``request`` as it is sent to ``deployment``: its schema said in the request body."""
    schema = request.schema
    if schema is None:
        return request
    mode = ask_mode(deployment)
    if mode == "json_schema" and deployment.provider_name == "anthropic" and not schema.object_rooted:
        raise InvalidRequestError(
            "schema: Anthropic answers JSON as a tool's input, which is an object; give a schema whose "
            'top level is {"type": "object", ...} (wrap a list or a value in one)'
        )
    params = dict(request.params)
    messages: Sequence[Mapping[str, Any]] = request.messages
    if mode == "json_schema" or (mode == "json_object" and schema.json_object):
        params["response_format"] = schema.response_format()
    else:
        if mode == "json_object":
            params["response_format"] = {"type": "json_object"}
        messages = _with_instruction(messages, schema)
    return dataclasses.replace(request, messages=messages, params=params, schema=None)


def sent_params(request: Request) -> Mapping[str, Any]:
    """``request.params`` with its schema in them, as the provider counts the prompt: the
    schema is sent with every ask (as a response format, a tool or words, of about the
    same size), so a token estimate or a worst case that left it out would be too low."""
    if request.schema is None:
        return request.params
    return {**request.params, "response_format": request.schema.response_format()}


def _with_instruction(messages: Sequence[Mapping[str, Any]], schema: Schema) -> list[Mapping[str, Any]]:
    """The schema in words, added to the leading system message (or as one)."""
    instruction = schema.instruction()
    first = messages[0] if messages else None
    if first is not None and first.get("role") == "system" and isinstance(first.get("content"), str):
        return [{**first, "content": f"{first['content']}\n\n{instruction}"}, *messages[1:]]
    return [{"role": "system", "content": instruction}, *messages]
