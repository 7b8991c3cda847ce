"""``POST /v1/embeddings``: texts in, vectors out in OpenAI's shape (floats, or base64 of
little-endian float32, which the official SDK asks for by default).

The texts (or token arrays, passed on as they are to deployments that take them; any
other refuses them with a 400) go through ``engine.embed_map`` (packed many to a
request, within the limits, the client's budget and the store); when any text fails,
the request fails as OpenAI's would, with the first failure's status and message.
"""

from __future__ import annotations

import base64
import sys
from array import array
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from ... import _json
from ..._embeddings import EmbeddingResult, token_array
from ..._models import Priority, Usage
from ..._tokens import estimate_text_tokens
from ...providers._embed import EmbedInput
from ..core._context import CONTEXT, JSON_BODY, BadBody, client_of

__all__ = ["embeddings", "parse_embeddings"]

#: The most texts one request may hold (OpenAI's own limit).
MAX_INPUTS = 2048


def parse_embeddings(body: Any) -> tuple[list[EmbedInput], str, int | None]:
    """(inputs, encoding format, dimensions) from an embeddings body; BadBody names a wrong field.

    ``input`` is what OpenAI takes: a string, an array of strings, a token array (an array
    of token ids) or an array of token arrays; a token array is passed on as it is."""
    if not isinstance(body, Mapping):
        raise BadBody("the request body must be a JSON object")
    given = body.get("input")
    if given is None:
        raise BadBody("you must provide an input parameter", "input")
    texts: list[EmbedInput]
    if isinstance(given, str):
        texts = [given]
    elif isinstance(given, list) and given and all(isinstance(t, str) for t in given):
        texts = list(given)
    elif isinstance(given, list) and given and all(type(t) is int for t in given):
        texts = [_tokens(given, "input")]
    elif isinstance(given, list) and given and all(isinstance(t, list) for t in given):
        texts = [_tokens(t, f"input[{i}]") for i, t in enumerate(given)]
    else:
        raise BadBody(
            "input must be a string, a non-empty array of strings, a token array (an array of token ids) "
            "or an array of token arrays",
            "input",
        )
    if len(texts) > MAX_INPUTS:
        raise BadBody(f"input holds {len(texts)} texts; at most {MAX_INPUTS} per request", "input")
    if any(not t for t in texts):
        raise BadBody("input must not contain empty strings", "input")
    fmt = body.get("encoding_format", "float")
    if fmt not in ("float", "base64"):
        raise BadBody("encoding_format must be 'float' or 'base64'", "encoding_format")
    dimensions = body.get("dimensions")
    if dimensions is not None and (isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1):
        raise BadBody("dimensions must be an integer >= 1", "dimensions")
    extra = sorted(set(body) - {"input", "model", "encoding_format", "dimensions", "user"})
    if extra:
        raise BadBody(f"unknown parameter(s) {extra}", extra[0])
    return texts, fmt, dimensions


async def embeddings(request: web.Request) -> web.Response:
    ctx = request.app[CONTEXT]
    client = client_of(request)
    body = request[JSON_BODY]
    if not isinstance(body, Mapping):
        raise BadBody("the request body must be a JSON object")
    model = ctx.resolve(client, body.get("model"))
    texts, fmt, dimensions = parse_embeddings(body)
    engine = ctx.engine
    estimated = sum(estimate_text_tokens(t) if isinstance(t, str) else len(t) for t in texts)
    tokens, limiters = ctx.estimated_tokens(model, lambda d: estimated)

    async def run() -> list[EmbeddingResult]:
        found = engine.embed_map(
            texts,
            model=model,
            dimensions=dimensions,
            ordered=True,
            budget=client.budget,
            priority=Priority.INTERACTIVE,
            scope=client.group,  # a tenant's stored vectors are its own (its cache_group's)
        )
        return [r async for r in found]

    results = await ctx.admit(client, request, tokens, limiters, run, _used)
    usage = Usage()
    for result in results:
        usage = usage + result.usage
        if result.cost_usd:
            ctx.metrics.cost.labels(client.name, result.deployment or "-").inc(result.cost_usd)
    ctx.metrics.tokens.labels(client.name, results[0].deployment or "-", "input").inc(usage.input_tokens)
    if client.budget is not None or ctx.clients.engine_budget is not None:
        ctx.clients.save()
    failed = next((r for r in results if not r.ok), None)
    if failed is not None:
        assert failed.error is not None
        return ctx.failure(client, failed.error)
    data = [
        {"object": "embedding", "index": r.index, "embedding": _encode(r.vector, fmt)}
        for r in results
        if r.vector is not None
    ]
    answer = {
        "object": "list",
        "data": data,
        "model": body["model"],
        "usage": {"prompt_tokens": usage.input_tokens, "total_tokens": usage.input_tokens},
    }
    return web.Response(body=_json.dumps(answer), content_type="application/json")


def _tokens(given: list[Any], where: str) -> list[int]:
    """A token array, checked: a non-empty array of integers >= 0."""
    tokens = token_array(given)
    if tokens is None:
        raise BadBody(f"{where} must be a non-empty array of token ids (integers >= 0)", where)
    return tokens


def _used(results: list[EmbeddingResult]) -> int | None:
    """Tokens the texts took from their client's tpm (None: nothing was sent)."""
    sent = [r for r in results if r.attempts and not r.cached]
    if not sent:
        return None
    return sum(r.usage.input_tokens for r in sent)


def _encode(vector: array[float], fmt: str) -> list[float] | str:
    if fmt == "float":
        return vector.tolist()
    if sys.byteorder != "little":  # the format is little-endian float32, whatever this machine is
        vector = array("f", vector)
        vector.byteswap()
    return base64.b64encode(vector.tobytes()).decode("ascii")
