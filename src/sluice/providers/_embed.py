"""Embeddings on the wire: one request carries many inputs, one vector comes back for each.

OpenAI's ``POST /v1/embeddings`` (and Azure's ``/openai/deployments/{d}/embeddings``,
and every compatible server) takes ``{"model", "input": [...], "encoding_format",
"dimensions"?}`` and answers ``data[i].embedding`` (with its ``index``) and
``usage.prompt_tokens``. A provider that can embed has :meth:`embed_batch`
(:class:`EmbeddingProvider`); the engine packs inputs into its requests (see
``sluice._embeddings``).

An input is a text or a token array (:data:`EmbedInput`: token ids, which OpenAI's API
takes as they are). A provider that can send token arrays says so per deployment
(:func:`takes_token_arrays`): OpenAI's and Azure's do, and every OpenAI-compatible
server unless its deployment's ``options["embed_token_arrays"]`` is false (a server
that knows only text); any other provider is never handed one.

Vectors are ``array('f')``: float32, 4 bytes a dimension (a list of Python floats takes
32), which is what the providers compute in; ``numpy.frombuffer(v, dtype=numpy.float32)``
reads one without a copy. ``encoding_format: "base64"`` (the float32 bytes, base64) is
~4x smaller on the wire than JSON numbers and needs no float parsing; it is asked of
OpenAI and Azure, and of other servers only when ``options["embedding_encoding"]`` says
so, since not every compatible server knows it (a server that ignores it and sends
numbers is read either way).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import sys
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, runtime_checkable

from .. import _json
from .._errors import (
    InvalidRequestError,
    MalformedResponseError,
)
from .._limits import RateLimitSnapshot
from .._models import Deployment, Usage
from ._http import token_count

if TYPE_CHECKING:
    from ._http import HttpProvider

__all__ = [
    "DEFAULT_LIMITS",
    "EmbedInput",
    "EmbedLimits",
    "EmbedReply",
    "EmbeddingProvider",
    "decode_vector",
    "embed_limits",
    "parse_embeddings",
    "post_embeddings",
    "simulated_vector",
    "takes_token_arrays",
]

#: One input: a text, or a token array (token ids of the model's tokenizer).
EmbedInput: TypeAlias = str | Sequence[int]


@dataclass(frozen=True, slots=True)
class EmbedReply:
    """One answered embeddings request: a vector per input, in input order."""

    vectors: Sequence[array[float]]
    usage: Usage
    request_id: str | None = None
    ratelimit: RateLimitSnapshot | None = None


@runtime_checkable
class EmbeddingProvider(Protocol):
    """A provider with an embeddings endpoint."""

    name: str

    async def embed_batch(
        self,
        texts: Sequence[EmbedInput],
        deployment: Deployment,
        *,
        params: Mapping[str, Any],
        idempotency_key: str | None = None,
    ) -> EmbedReply:
        """One attempt at embedding ``texts`` in one request (token arrays only when
        :func:`takes_token_arrays`). Raises a ProviderError subclass on failure, as
        :meth:`Provider.send` does."""
        ...


def takes_token_arrays(provider: object, deployment: Deployment) -> bool:
    """Whether ``provider`` may be sent token arrays for ``deployment``: it has a
    ``takes_token_arrays(deployment)`` that says so (a provider without one takes text only)."""
    check = getattr(provider, "takes_token_arrays", None)
    return bool(check(deployment)) if callable(check) else False


@dataclass(frozen=True, slots=True)
class EmbedLimits:
    """What one embeddings request may carry.

    OpenAI's API reference (``input`` of ``POST /v1/embeddings``): "any array must be
    2048 dimensions or less", "the input must not exceed the max input tokens for the
    model (8192 tokens for all embedding models)", and "all embedding models enforce a
    maximum of 300,000 tokens summed across all inputs in a single request"
    (platform.openai.com/docs/api-reference/embeddings/create). Other servers differ
    (Hugging Face TEI takes 32 inputs by default): set ``embed_batch_size`` /
    ``embed_batch_tokens`` / ``embed_input_tokens`` in the deployment's ``options``, or
    let sluice learn them from the server's refusals.
    """

    max_inputs: int = 2048
    max_tokens: int = 300_000
    max_input_tokens: int = 8192


DEFAULT_LIMITS = EmbedLimits()
#: aiohttp's ``TOO_LARGE_BYTES_BODY``.
_LARGE_BODY = 1 << 20
_LIMIT_OPTIONS = (
    ("embed_batch_size", "max_inputs"),
    ("embed_batch_tokens", "max_tokens"),
    ("embed_input_tokens", "max_input_tokens"),
)


def embed_limits(deployment: Deployment) -> EmbedLimits:
    """The deployment's per-request limits: its ``options`` where given, else OpenAI's."""
    values: dict[str, int] = {}
    for option, name in _LIMIT_OPTIONS:
        value = deployment.options.get(option)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidRequestError(
                f"deployment {deployment.label!r}: option {option} must be a positive integer, got {value!r}"
            )
        values[name] = value
    return EmbedLimits(**values) if values else DEFAULT_LIMITS


def decode_vector(value: Any) -> array[float]:
    """A vector from a response: base64 float32 (little-endian, as OpenAI sends it) or a
    list of numbers. Raises ValueError/TypeError for anything else."""
    vector: array[float] = array("f")
    if isinstance(value, str):
        try:
            vector.frombytes(base64.b64decode(value, validate=True))
        except binascii.Error as exc:
            raise ValueError(f"an embedding is not valid base64 ({exc})") from None
        if sys.byteorder != "little":  # pragma: no cover - big-endian machines are rare
            vector.byteswap()
        return vector
    if isinstance(value, list):
        return array("f", value)
    raise TypeError(f"an embedding is a {type(value).__name__}, not a list of numbers or base64")


def parse_embeddings(body: Mapping[str, Any], count: int) -> tuple[list[array[float]], Usage]:
    """Vectors (in input order) and usage from a 200 body answering ``count`` inputs."""
    data = body.get("data")
    if not isinstance(data, list) or len(data) != count:
        got = len(data) if isinstance(data, list) else "no"
        raise MalformedResponseError(f"the response has {got} embeddings for {count} inputs")
    vectors: list[array[float] | None] = [None] * count
    for position, item in enumerate(data):
        if not isinstance(item, Mapping):
            raise MalformedResponseError(f"data[{position}] is not an object")
        index = item.get("index", position)
        if not isinstance(index, int) or not 0 <= index < count or vectors[index] is not None:
            raise MalformedResponseError(f"data[{position}] has index {index!r}, not one of 0..{count - 1} once")
        vectors[index] = decode_vector(item.get("embedding"))
    usage = body.get("usage") if isinstance(body.get("usage"), Mapping) else {}
    assert isinstance(usage, Mapping)
    tokens = token_count(usage.get("prompt_tokens")) or token_count(usage.get("total_tokens"))
    return [v for v in vectors if v is not None], Usage(input_tokens=tokens)


def embed_body(model: str, texts: Sequence[EmbedInput], params: Mapping[str, Any], encoding: str) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "input": [t if isinstance(t, str) else list(t) for t in texts],
        "encoding_format": encoding,
    }
    body.update(params)
    return body


async def post_embeddings(
    provider: HttpProvider,
    url: str,
    texts: Sequence[EmbedInput],
    deployment: Deployment,
    params: Mapping[str, Any],
    *,
    encoding: str,
    idempotency_key: str | None,
) -> EmbedReply:
    """One embeddings request through the provider's round trip (:meth:`HttpProvider.post`:
    the pooled session, the same typed errors as a chat request's)."""
    try:
        data = _json.dumps(embed_body(deployment.model_name, texts, params, encoding))
    except (TypeError, ValueError) as exc:  # UnicodeEncodeError is a ValueError
        raise InvalidRequestError(f"the inputs cannot be sent as JSON: {exc}") from None
    # Past 1 MiB aiohttp wants a stream (it writes one in chunks, yielding between them)
    # and warns about raw bytes; a 300k-token request is ~1.2 MB.
    body: bytes | io.BytesIO = io.BytesIO(data) if len(data) > _LARGE_BODY else data
    payload, request_id, ratelimit = await provider.post(deployment, body, url=url, idempotency_key=idempotency_key)
    try:
        answer = _json.loads(payload)
        if not isinstance(answer, Mapping):
            raise TypeError("the body is not a JSON object")
        vectors, usage = parse_embeddings(answer, len(texts))
    except MalformedResponseError as exc:
        raise MalformedResponseError(f"{deployment.label}: {exc.message}", request_id=request_id) from None
    except (TypeError, ValueError, OverflowError) as exc:
        raise MalformedResponseError(
            f"{deployment.label} answered 200 with an unexpected embeddings body ({exc})", request_id=request_id
        ) from None
    return EmbedReply(vectors, usage, request_id, ratelimit)


#: Float32 bit masks per dimension count: keep the sign and mantissa of random bits, set
#: the exponent so every value lies in [0.5, 1) in size. Built from whole-vector integer
#: operations: a pure-Python loop per dimension would cost ~1 s per 10,000 vectors.
_MASKS: dict[int, tuple[int, int]] = {}


def simulated_vector(text: str, dimensions: int) -> array[float]:
    """A deterministic pseudo-random vector for ``text`` (the same text, the same vector),
    for the simulated provider: not a meaning, a stand-in of the right shape."""
    masks = _MASKS.get(dimensions)
    if masks is None:
        keep = int.from_bytes(b"\xff\xff\x7f\x80" * dimensions, "little")
        exponent = int.from_bytes(b"\x00\x00\x00\x3f" * dimensions, "little")
        masks = _MASKS[dimensions] = (keep, exponent)
    size = 4 * dimensions
    bits = int.from_bytes(hashlib.shake_256(text.encode("utf-8", "surrogatepass")).digest(size), "little")
    vector: array[float] = array("f")
    vector.frombytes(((bits & masks[0]) | masks[1]).to_bytes(size, "little"))
    if sys.byteorder != "little":  # pragma: no cover
        vector.byteswap()
    return vector
