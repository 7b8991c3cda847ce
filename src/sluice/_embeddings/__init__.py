"""Embeddings in the engine: many texts per request, under the same limits, budgets,
retries and store as chat completions.

* :mod:`._keys`: what identifies a vector (:func:`embedding_key`) and what texts are
  embedded with (:class:`EmbedSpec`);
* :mod:`._packing`: texts packed into requests, split when refused, limits learnt;
* :mod:`._pipeline`: the stream of texts through the attempt core (:class:`EmbedPipeline`);
* here: ``Engine.embed`` and ``Engine.embed_map`` on top of it.
"""

from __future__ import annotations

import itertools
from array import array
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._budget import Budget
from .._errors import CancelledError, EmbeddingError
from .._models import Priority
from ..providers._embed import EmbedInput
from ._keys import EmbedItem, EmbedSpec, embedding_key, token_array
from ._packing import BOUND_PER_INPUT
from ._pipeline import DEFAULT_WINDOW, EmbedPipeline
from ._results import EmbeddingResult

if TYPE_CHECKING:
    from .._attempts import Attempts

__all__ = [
    "BOUND_PER_INPUT",
    "DEFAULT_WINDOW",
    "EmbedItem",
    "EmbedOptions",
    "EmbedPipeline",
    "EmbedSpec",
    "EmbeddingError",
    "EmbeddingResult",
    "embed",
    "embed_map",
    "embedding_key",
    "token_array",
]


@dataclass(frozen=True, slots=True)
class EmbedOptions:
    """What ``embed``/``embed_map`` are asked for, once (the engine's methods, the
    pipeline's spec and its request caps all come from it)."""

    model: str
    dimensions: int | None = None
    params: Mapping[str, Any] | None = field(default=None)
    priority: int = Priority.NORMAL
    budget: Budget | None = None
    batch_size: int | None = None
    batch_tokens: int | None = None
    window: int = DEFAULT_WINDOW
    #: Texts share stored vectors only within their scope (None: with everyone's).
    scope: str | None = None

    def spec(self) -> EmbedSpec:
        merged = dict(self.params or {})
        if self.dimensions is not None:
            merged["dimensions"] = self.dimensions
        return EmbedSpec(self.model, merged)

    def pipeline(self, attempts: Attempts, *, ordered: bool = False) -> EmbedPipeline:
        return EmbedPipeline(
            attempts,
            priority=self.priority,
            budget=self.budget,
            ordered=ordered,
            window=self.window,
            batch_size=self.batch_size,
            batch_tokens=self.batch_tokens,
        )


def _items(
    texts: Iterable[EmbedInput] | AsyncIterable[EmbedInput], spec: EmbedSpec, scope: str | None = None
) -> Iterable[EmbedItem] | AsyncIterable[EmbedItem]:
    if isinstance(texts, str):
        texts = [texts]  # one string is one text
    if isinstance(texts, AsyncIterable):
        source = texts

        async def items() -> AsyncIterator[EmbedItem]:
            async for text in source:
                yield EmbedItem(text, spec, scope)

        return items()
    return (EmbedItem(text, spec, scope) for text in texts)


def embed_map(
    attempts: Attempts,
    texts: Iterable[EmbedInput] | AsyncIterable[EmbedInput],
    options: EmbedOptions,
    *,
    ordered: bool = False,
) -> AsyncIterator[EmbeddingResult]:
    """See :meth:`Engine.embed_map`."""
    return options.pipeline(attempts, ordered=ordered).results(_items(texts, options.spec(), options.scope))


async def embed(
    attempts: Attempts, texts: Iterable[EmbedInput] | AsyncIterable[EmbedInput], options: EmbedOptions
) -> list[array[float]]:
    """See :meth:`Engine.embed`."""
    pipeline = options.pipeline(attempts)
    results: list[EmbeddingResult | None] = []
    async for result in pipeline.results(_items(texts, options.spec(), options.scope)):
        if result.index >= len(results):
            results.extend(itertools.repeat(None, result.index + 1 - len(results)))
        results[result.index] = result
    done = [
        r if r is not None else EmbeddingResult(i, error=CancelledError("never read")) for i, r in enumerate(results)
    ]
    failed = [r for r in done if not r.ok]
    if failed or not pipeline.exhausted:
        first = failed[0] if failed else None
        what = f"{len(failed):,} of {len(done):,} texts could not be embedded"
        if first is not None and first.error is not None:
            what += f" (first: text {first.index}: {first.error.message})"
        if not pipeline.exhausted:
            what += f"; the engine stopped after reading {len(done):,} texts"
        raise EmbeddingError(
            what + "; the vectors made are in .results, and in the store: a rerun embeds only the rest", done
        )
    return [r.unwrap() for r in done]
