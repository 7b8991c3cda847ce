"""What identifies an embedding: its model, text and parameters (versioned), and the
spec texts are embedded with. A vector is stored per text under :func:`embedding_key`, so
a rerun, another job or another line with the same text embeds nothing again.

An input is a text or a token array (a list of token ids, as OpenAI's API takes them):
:func:`input_bytes` gives each its bytes, an array's marked with a byte no UTF-8 text
holds, so a text and an array never share a key."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .. import _json
from .._errors import InvalidRequestError, SluiceError
from ..providers._embed import EmbedInput

__all__ = [
    "TOKENS_MARK",
    "EmbedInput",
    "EmbedItem",
    "EmbedSpec",
    "embedding_key",
    "input_bytes",
    "input_of",
    "key_of",
    "token_array",
]

#: The first byte of a token array's bytes: never in UTF-8, so never a text's.
TOKENS_MARK = b"\xff"

_KEY_VERSION = "sluice-embedding-v1"
#: Parameters that do not change a vector: left out of its key.
_NOT_IN_KEY = frozenset({"user", "encoding_format"})
#: Parameters sluice sets itself.
_OWN = frozenset({"model", "input", "encoding_format"})


def _model_name(model: str) -> str:
    return model if "/" in model else f"openai/{model}"  # a bare name is the OpenAI-compatible one


def _key_prefix(model: str, params: Mapping[str, Any]) -> bytes:
    keyed = {k: v for k, v in params.items() if k not in _NOT_IN_KEY}
    return _json.canonical({"v": _KEY_VERSION, "model": _model_name(model), "params": keyed}) + b"\x00"


def key_of(prefix: bytes, data: bytes, scope: str | None) -> str:
    """The key of one text's bytes under a spec's key prefix (and a scope, or shared)."""
    digest = hashlib.sha256(prefix)
    if scope is not None:
        digest.update(scope.encode("utf-8", "surrogatepass") + b"\x1f")
    digest.update(data)
    return digest.hexdigest()[:32]


def embedding_key(
    model: str, text: EmbedInput, params: Mapping[str, Any] | None = None, *, scope: str | None = None
) -> str:
    """The store key of one text's (or token array's) vector: its model, input and
    parameters (``dimensions``...; not ``user`` or ``encoding_format``), versioned.
    ``scope`` (a line, under ``--no-cache``) keeps identical texts apart."""
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else input_bytes(text)
    return key_of(_key_prefix(model, params or {}), data, scope)


def token_array(value: Any) -> list[int] | None:
    """``value`` as a token array (a non-empty list or tuple of token ids, ints >= 0), or
    None when it is not one."""
    if not isinstance(value, (list, tuple)) or not value:
        return None
    for token in value:
        if type(token) is not int or token < 0:  # not bool, which is an int
            return None
    return list(value)


def input_bytes(value: EmbedInput) -> bytes:
    """An input's bytes: a text's UTF-8 (UnicodeEncodeError for a lone surrogate), a token
    array's ids after :data:`TOKENS_MARK`."""
    if isinstance(value, str):
        return value.encode("utf-8")
    return TOKENS_MARK + ",".join(map(str, value)).encode("ascii")


def input_of(data: bytes) -> EmbedInput:
    """The input :func:`input_bytes` made ``data`` of."""
    if data[:1] == TOKENS_MARK:
        return [int(token) for token in data[1:].split(b",")]
    return data.decode("utf-8")


@dataclass(frozen=True, slots=True)
class EmbedSpec:
    """What texts are embedded with: the model and the request's other parameters
    (``dimensions``, ``user``, a provider's own). Texts with equal specs share requests."""

    model: str
    params: Mapping[str, Any] = field(default_factory=dict)
    #: The key prefix (and group identity), computed once.
    prefix: bytes = b""

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model.strip():
            raise InvalidRequestError(f"model must be a non-empty string, got {self.model!r}")
        if not isinstance(self.params, Mapping):
            raise InvalidRequestError(f"params must be a mapping, got {type(self.params).__name__}")
        own = sorted(_OWN & set(self.params))
        if own:
            raise InvalidRequestError(
                f"params must not set {', '.join(own)}: sluice sends the texts, the model and the wire encoding"
            )
        dimensions = self.params.get("dimensions")
        if dimensions is not None and (
            isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1
        ):
            raise InvalidRequestError(f"dimensions must be a positive integer, got {dimensions!r}")
        object.__setattr__(self, "prefix", _key_prefix(self.model, self.params))


class EmbedItem(NamedTuple):
    """One input of :class:`EmbedPipeline`: a text or token array (or the error that stands
    for a bad input record), what to embed it with, and its key's scope (None: shared)."""

    text: EmbedInput | SluiceError
    spec: EmbedSpec
    scope: str | None = None
