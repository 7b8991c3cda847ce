"""Input records that ask for embeddings, one :class:`EmbeddingInput` each:

* an OpenAI Batch API line with ``"url": "/v1/embeddings"`` and a body
  ``{"model", "input": "text" | ["text", ...], "dimensions"?, "encoding_format"?, ...}``
  (the record holds one vector for a string input, a list of them for a list);
* a CSV or JSONL row with ``--embed FIELD``: that field's text, with ``--model``.

``encoding_format: "base64"`` changes only how the output record writes the vector (the
float32 bytes in base64, as OpenAI would send them); every other body field but ``model``
and ``input`` goes to the provider as it is.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .. import _json
from .._errors import InvalidInputError

if TYPE_CHECKING:
    from ._inputs import InputOptions

__all__ = ["EMBEDDING_URLS", "EmbeddingInput", "embedding_from_body", "embedding_from_row", "embedding_hash"]

EMBEDDING_URLS = ("/v1/embeddings", "/embeddings")


@dataclass(frozen=True, slots=True)
class EmbeddingInput:
    """One record's texts to embed, and how."""

    model: str
    texts: tuple[str, ...]
    params: Mapping[str, Any] = field(default_factory=dict)
    #: The input was one string: the record holds one vector (else a list of them).
    single: bool = True
    id: str | None = None
    #: The output record carries each vector as base64 float32 (``encoding_format``).
    base64: bool = False
    metadata: Mapping[str, Any] = field(default_factory=dict)


def embedding_hash(embedding: EmbeddingInput) -> str:
    """16 hex digits naming what a line asks (as ``request_hash`` does for chat lines)."""
    payload = {"id": embedding.id, "model": embedding.model, "input": embedding.texts, "params": embedding.params}
    return hashlib.blake2b(_json.canonical(payload), digest_size=8).hexdigest()


def _model(own: Any, where: str, options: InputOptions) -> str:
    if options.force_model or own == "":
        own = None
    if own is not None and not isinstance(own, str):
        raise InvalidInputError(f"{where}: model must be a string, got {own!r}")
    model = own or options.model or options.default_model
    if not model:
        raise InvalidInputError(f"{where}: no model; give --model or a 'model' field")
    return str(model)


def embedding_from_body(
    body: Mapping[str, Any], where: str, options: InputOptions, *, request_id: str | None
) -> EmbeddingInput:
    """The body of a Batch API ``/v1/embeddings`` line."""
    texts = body.get("input")
    single = isinstance(texts, str)
    if single:
        texts = [texts]
    if not isinstance(texts, list) or not texts:
        raise InvalidInputError(f"{where}: input must be a string or a non-empty list of strings")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            kind = "token arrays are not supported; give the texts" if isinstance(text, int | list) else "not a string"
            raise InvalidInputError(f"{where}: input[{i}]: {kind}")
        if not text:
            raise InvalidInputError(f"{where}: input[{i}] is empty; the embeddings API refuses empty inputs")
    encoding = body.get("encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise InvalidInputError(f"{where}: encoding_format must be 'float' or 'base64', got {encoding!r}")
    dimensions = body.get("dimensions")
    if dimensions is not None and (isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1):
        raise InvalidInputError(f"{where}: dimensions must be a positive integer, got {dimensions!r}")
    params = {k: v for k, v in body.items() if k not in ("model", "input", "encoding_format")}
    return EmbeddingInput(
        model=_model(body.get("model") or None, where, options),
        texts=tuple(texts),
        params=params,
        single=single,
        id=request_id,
        base64=encoding == "base64",
    )


def embedding_from_row(row: Mapping[str, Any], where: str, options: InputOptions) -> EmbeddingInput:
    """A CSV or JSONL row under ``--embed FIELD``."""
    name = options.embed_field
    assert name is not None
    value = row.get(name)
    if value is None or value == "":
        have = ", ".join(str(k) for k in row if k is not None) or "none"
        raise InvalidInputError(f"{where}: no text in field {name!r} to embed (fields: {have})")
    row_id = None
    if options.id_field is not None:
        given = row.get(options.id_field)
        if given is None or given == "":
            raise InvalidInputError(f"{where}: no value in id field {options.id_field!r}")
        row_id = given if isinstance(given, str) else json.dumps(given, ensure_ascii=False)
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return EmbeddingInput(
        model=_model(None, where, options),
        texts=(text,),
        id=row_id,
        metadata={k: v for k, v in row.items() if k is not None},
    )
