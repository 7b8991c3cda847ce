"""What the engine accepts as a request, made into a :class:`Request` (or a clear error)."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Mapping, Sequence
from typing import Any

from ._errors import InvalidRequestError, SluiceError
from ._models import Request
from .structured import Schema

__all__ = ["RequestLike", "aiterate", "coerce", "make_request", "with_schema"]

#: What ``map`` accepts per item: a Request, a dict of Request fields, a prompt string,
#: or a SluiceError standing for a bad input record (it becomes that item's result).
RequestLike = Request | Mapping[str, Any] | str | SluiceError

_REQUEST_FIELDS = frozenset(f.name for f in dataclasses.fields(Request) if f.init)


def make_request(
    model: str | Request, messages: Sequence[Mapping[str, Any]] | str | None, fields: Mapping[str, Any]
) -> Request:
    """``complete()``'s arguments as a Request."""
    if isinstance(model, Request):
        if messages is not None or fields:
            raise InvalidRequestError("complete(request) takes no further messages or fields")
        return model
    if messages is None:
        raise InvalidRequestError("complete(model, messages): messages are missing")
    if isinstance(messages, str):
        return Request.from_prompt(model, messages, **fields)
    try:
        return Request(model=model, messages=messages, **fields)
    except TypeError as exc:
        raise InvalidRequestError(f"complete(): {exc}") from None


def coerce(item: object, model: str | None) -> Request:
    """An input item as a Request: a Request, a dict of its fields, or a prompt string.

    An exception as an item stands for a bad input record: it becomes that item's error.
    """
    if isinstance(item, Request):
        return item
    if isinstance(item, SluiceError):
        raise item
    if isinstance(item, str):
        if model is None:
            raise InvalidRequestError("a prompt string needs map(..., model=...) to say which model")
        return Request.from_prompt(model, item)
    if isinstance(item, Mapping):
        unknown = set(item) - _REQUEST_FIELDS
        if unknown:
            raise InvalidRequestError(
                f"unknown field(s) {sorted(unknown)}; a request has {sorted(_REQUEST_FIELDS)} "
                "(put provider parameters under 'params')"
            )
        fields = dict(item)
        if "model" not in fields:
            if model is None:
                raise InvalidRequestError("no 'model' in the item and no map(..., model=...) default")
            fields["model"] = model
        if "messages" not in fields:
            raise InvalidRequestError("no 'messages' in the item")
        return Request(**fields)
    raise InvalidRequestError(f"cannot make a request from a {type(item).__name__}")


async def aiterate(source: Iterable[Any] | AsyncIterable[Any]) -> AsyncIterator[Any]:
    if isinstance(source, AsyncIterable):
        async for item in source:
            yield item
    else:
        for item in source:
            yield item


async def with_schema(source: Iterable[Any] | AsyncIterable[Any], schema: Any, model: str | None) -> AsyncIterator[Any]:
    """``source``'s items, each given ``schema`` unless it has one (or a response_format) of
    its own; an item that cannot be a request passes as it is, to fail as itself."""
    shape = Schema.of(schema)  # a bad schema fails here, once, not as every item's error
    async for item in aiterate(source):
        if isinstance(item, str) and model is not None:
            yield Request.from_prompt(model, item, schema=shape)
        elif isinstance(item, Request) and item.schema is None and "response_format" not in item.params:
            yield dataclasses.replace(item, schema=shape)
        elif isinstance(item, Mapping) and item.get("schema") is None and not _has_format(item.get("params")):
            yield {**item, "schema": shape}
        else:
            yield item


def _has_format(params: object) -> bool:
    return isinstance(params, Mapping) and "response_format" in params
