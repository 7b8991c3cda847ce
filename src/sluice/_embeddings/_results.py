"""One text's outcome: a vector, or a typed error, with its share of what its request cost."""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

from .._errors import SluiceError
from .._models import Usage

__all__ = ["EmbeddingResult"]


@dataclass(frozen=True, slots=True, eq=False)
class EmbeddingResult:
    """One text's outcome: ``vector`` (float32 ``array('f')``), or a typed ``error``.

    ``usage`` and ``cost_usd`` are the text's share of its request's (in proportion to
    its estimated tokens; the shares add up to what the provider reported); ``cached``:
    served from the store or from an identical text in the same run, nothing sent.
    """

    index: int
    vector: array[float] | None = None
    error: SluiceError | None = None
    usage: Usage = field(default_factory=Usage)
    cost_usd: float | None = None
    attempts: int = 0
    cached: bool = False
    deployment: str | None = None
    latency: float = 0.0
    key: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.vector is not None

    @property
    def dimensions(self) -> int:
        return len(self.vector) if self.vector is not None else 0

    def unwrap(self) -> array[float]:
        """The vector, or raise the error."""
        if self.vector is None:
            raise self.error or SluiceError(f"text {self.index} has no vector")
        return self.vector

    def __repr__(self) -> str:
        outcome = f"dimensions={self.dimensions}" if self.ok else f"error={self.error!r}"
        return f"EmbeddingResult(index={self.index}, {outcome}, cached={self.cached}, deployment={self.deployment!r})"
