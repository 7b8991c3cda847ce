"""The fake's ``POST /v1/embeddings``: OpenAI's request checks and per-request limits,
deterministic vectors, usage from the fake's own tokenizer.

Vectors are seeded from a hash of the text (the same text, the same vector), of the
model's length (3072 for ``*-large``, else 1536) or the request's ``dimensions``, sent
as JSON numbers or, with ``encoding_format: "base64"``, as base64 float32 bytes.

Like OpenAI it takes token arrays too (``input`` a list of token ids, or a list of
them): each is as many tokens as it is long, and kept in :attr:`EmbeddingsFormat.token_arrays`.

Like OpenAI it refuses a whole request with a 400 for one bad input, without saying
which (so a client has to find it): an empty string, an input over
:attr:`EmbeddingsFormat.max_input_tokens`, more than :attr:`~EmbeddingsFormat.max_inputs`
inputs or more than :attr:`~EmbeddingsFormat.max_tokens` in all. For tests, an input
containing :attr:`~EmbeddingsFormat.reject_marker` is refused the same way. Each is an
attribute to change while the server runs (``server.embeddings.max_inputs = 32``).
"""

from __future__ import annotations

import base64
import hashlib
import sys
from array import array
from collections.abc import Mapping
from typing import Any, NamedTuple

from ._formats import ApiError, Call, ErrorKind, OpenAIFormat, dumps
from ._tokenizer import PromptCounter

__all__ = ["REJECT_MARKER", "EmbeddingsFormat"]

#: An input holding this is refused (a 400 for the whole request, as a bad input is).
REJECT_MARKER = "<<sluice-fake-reject>>"
_INVALID = "'$.input' is invalid. Please check the API reference: https://platform.openai.com/docs/api-reference."
_TOO_MANY_TOKENS = "Requested {0} tokens, max {1} tokens per request"


class _Inputs(NamedTuple):
    """What a valid embeddings request asks, for the 200 body."""

    texts: list[str | list[int]]
    dimensions: int
    base64: bool


_MASKS: dict[int, tuple[int, int]] = {}


def fake_vector(text: str, dimensions: int) -> bytes:
    """Float32 little-endian bytes of a deterministic vector for ``text``: hash-seeded bits
    with the exponent fixed so every value lies in ±[0.5, 1)."""
    masks = _MASKS.get(dimensions)
    if masks is None:  # whole-vector integer masks: a loop per dimension is ~50x slower
        keep = int.from_bytes(b"\xff\xff\x7f\x80" * dimensions, "little")
        exponent = int.from_bytes(b"\x00\x00\x00\x3f" * dimensions, "little")
        masks = _MASKS[dimensions] = (keep, exponent)
    size = 4 * dimensions
    bits = int.from_bytes(hashlib.shake_256(text.encode("utf-8", "surrogatepass")).digest(size), "little")
    data = ((bits & masks[0]) | masks[1]).to_bytes(size, "little")
    if sys.byteorder != "little":  # pragma: no cover
        swapped = array("f", data)
        swapped.byteswap()
        data = swapped.tobytes()
    return data


def _inputs(given: Any) -> list[str | list[int]] | None:
    """The inputs of ``input`` as OpenAI takes it (a string, strings, a token array, token
    arrays), or None for anything else."""
    if isinstance(given, str):
        given = [given]
    if not isinstance(given, list) or not given:
        return None
    if all(type(t) is int and t >= 0 for t in given):
        return [list(given)]
    if all(isinstance(t, str) and t for t in given):
        return list(given)
    if all(isinstance(t, list) and t and all(type(i) is int and i >= 0 for i in t) for t in given):
        return [list(t) for t in given]
    return None


class EmbeddingsFormat(OpenAIFormat):
    """OpenAI Embeddings, with its limits (see the module docstring)."""

    def __init__(self, counter: PromptCounter | None = None) -> None:
        super().__init__(counter)
        #: OpenAI's limits (platform.openai.com/docs/api-reference/embeddings/create).
        self.max_inputs = 2048
        self.max_input_tokens = 8192
        self.max_tokens = 300_000
        self.reject_marker: str | None = REJECT_MARKER
        #: Inputs per request answered with a 200, in order.
        self.batch_sizes: list[int] = []
        #: Prompt tokens per request answered with a 200, in order.
        self.batch_tokens: list[int] = []
        #: Token arrays received (as they came), in requests answered with a 200.
        self.token_arrays: list[list[int]] = []

    @property
    def texts_embedded(self) -> int:
        return sum(self.batch_sizes)

    def parse(self, body: Any, headers: Mapping[str, str]) -> Call:
        if not isinstance(body, dict):
            raise ApiError(400, "invalid_request", "The request body must be a JSON object.")
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise ApiError(400, "invalid_request", "you must provide a model parameter", "model")
        texts = _inputs(body.get("input"))
        if texts is None:
            raise ApiError(400, "invalid_request", _INVALID)
        if len(texts) > self.max_inputs:
            raise ApiError(400, "invalid_request", _INVALID)
        encoding = body.get("encoding_format", "float")
        if encoding not in ("float", "base64"):
            raise ApiError(
                400, "invalid_request", f"{encoding!r} is not one of ['float', 'base64'] - 'encoding_format'"
            )
        native = 3072 if model.endswith("-large") else 1536
        dimensions = body.get("dimensions", native)
        if isinstance(dimensions, bool) or not isinstance(dimensions, int) or not 1 <= dimensions <= native:
            raise ApiError(400, "invalid_request", f"dimensions must be between 1 and {native}", "dimensions")
        count = self.counter.text
        total = 0
        for text in texts:
            tokens = count(text) if isinstance(text, str) else len(text)
            if tokens > self.max_input_tokens:
                raise ApiError(
                    400,
                    "invalid_request",
                    f"This model's maximum context length is {self.max_input_tokens} tokens, however you "
                    f"requested {tokens} tokens ({tokens} in your prompt; 0 for the completion). "
                    "Please reduce your prompt; or completion length.",
                )
            if self.reject_marker is not None and isinstance(text, str) and self.reject_marker in text:
                raise ApiError(400, "invalid_request", _INVALID)
            total += tokens
        if total > self.max_tokens:
            raise ApiError(400, "invalid_request", _TOO_MANY_TOKENS.format(total, self.max_tokens))
        return Call(model, 0, total, "", _Inputs(texts, dimensions, encoding == "base64"))

    def success(self, n: int, call: Call, completion: int, cut: bool, created: int) -> bytes:
        inputs = call.extra
        assert isinstance(inputs, _Inputs)
        data: list[dict[str, Any]] = []
        for index, text in enumerate(inputs.texts):
            if not isinstance(text, str):
                self.token_arrays.append(text)
            raw = fake_vector(text if isinstance(text, str) else repr(text), inputs.dimensions)
            embedding: Any = base64.b64encode(raw).decode() if inputs.base64 else array("f", raw).tolist()
            data.append({"object": "embedding", "index": index, "embedding": embedding})
        self.batch_sizes.append(len(inputs.texts))
        self.batch_tokens.append(call.prompt_tokens)
        usage = {"prompt_tokens": call.prompt_tokens, "total_tokens": call.prompt_tokens}
        return dumps({"object": "list", "data": data, "model": call.model, "usage": usage})

    def empty(self, n: int, model: str, created: int) -> bytes:
        return dumps({"object": "list", "data": [], "model": model, "usage": {"prompt_tokens": 0, "total_tokens": 0}})

    def error(self, kind: ErrorKind, message: str, param: str | None = None) -> bytes:
        if message.startswith("Requested ") and message.endswith("tokens per request"):
            code = "max_tokens_per_request"  # as OpenAI types this one
            return dumps({"error": {"message": message, "type": code, "param": None, "code": code}})
        return super().error(kind, message, param)
