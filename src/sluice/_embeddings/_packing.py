"""Packing texts into requests: one distinct text in flight (:class:`Entry`), the texts of
one request (:class:`Pack`, split in halves when refused), and the texts of one spec with
the limits learnt as they go (:class:`SpecGroup`)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .._errors import SluiceError
from ..providers._embed import EmbedLimits
from ._keys import TOKENS_MARK, EmbedInput, EmbedSpec, input_of

if TYPE_CHECKING:
    from .._router import Group

__all__ = ["BOUND_PER_INPUT", "Entry", "Pack", "SpecGroup", "apportion"]

#: A budget's bound on one input: every token of a byte-level BPE tokenizer covers at
#: least one byte, so a text bills at most its UTF-8 length; this covers the special
#: tokens some models add around each input (BERT-style [CLS]/[SEP], BOS/EOS). A token
#: array bills its length, and the same.
BOUND_PER_INPUT = 8


class Entry:
    """One distinct text (or token array) in flight, and every input position waiting for it."""

    __slots__ = ("bound", "data", "done", "indices", "key", "tokens")

    def __init__(self, key: str, data: bytes, tokens: int, index: int) -> None:
        self.key = key
        self.data = data
        self.tokens = tokens
        self.bound = (tokens if data[:1] == TOKENS_MARK else len(data)) + BOUND_PER_INPUT
        self.indices = [index]
        self.done = False


class Pack:
    """Texts sent in one request."""

    __slots__ = ("attempts_before", "by_count", "entries", "split", "tokens")

    def __init__(self, entries: list[Entry] | None = None, *, split: bool = False, attempts_before: int = 0) -> None:
        self.entries = entries or []
        self.tokens = sum(e.tokens for e in self.entries)
        self.split = split
        self.attempts_before = attempts_before
        #: Sealed because it reached the count limit (not the token limit).
        self.by_count = False

    def add(self, entry: Entry) -> None:
        self.entries.append(entry)
        self.tokens += entry.tokens

    @property
    def bound(self) -> int:
        return sum(e.bound for e in self.entries)

    def key(self) -> str:
        digest = hashlib.blake2b(digest_size=16)
        for entry in self.entries:
            digest.update(entry.key.encode())
        return "embed-" + digest.hexdigest()

    def texts(self) -> list[EmbedInput]:
        return [input_of(e.data) for e in self.entries]

    def halves(self, attempts: int) -> tuple[Pack, Pack]:
        middle = len(self.entries) // 2
        before = self.attempts_before + attempts
        return (
            Pack(self.entries[:middle], split=True, attempts_before=before),
            Pack(self.entries[middle:], split=True, attempts_before=before),
        )

    def __len__(self) -> int:
        return len(self.entries)


class SpecGroup:
    """Texts of one spec: their deployments, limits (learnt as they go) and open pack."""

    __slots__ = (
        "error",
        "limits",
        "max_inputs",
        "ok_seen",
        "open",
        "refusal",
        "rejected_alone",
        "route_group",
        "spec",
        "text_only",
        "token_cap",
    )

    def __init__(self, spec: EmbedSpec) -> None:
        self.spec = spec
        self.route_group: Group | None = None
        #: Why no text of this spec can be embedded (unknown model, no endpoint, no price).
        self.error: SluiceError | None = None
        #: A deployment of the group that takes no token arrays (None: they all do).
        self.text_only: str | None = None
        self.limits = EmbedLimits()
        self.max_inputs = self.limits.max_inputs
        self.token_cap = self.limits.max_tokens
        self.open = Pack()
        self.ok_seen = False
        self.rejected_alone = 0
        self.refusal: SluiceError | None = None

    @property
    def refused_outright(self) -> bool:
        """Nothing of this kind has gone through and single texts are refused too: the
        request itself is refused, not one input."""
        return not self.ok_seen and self.rejected_alone >= 2

    def learn(self, pack: Pack) -> tuple[int, int]:
        """A pack refused whole whose halves both went through was too large: the limits
        from now on, (inputs, tokens) per request."""
        if pack.by_count or len(pack) >= self.max_inputs:
            self.max_inputs = max(1, min(self.max_inputs, len(pack) // 2))
        else:
            self.token_cap = max(1, min(self.token_cap, pack.tokens // 2))
        return self.max_inputs, self.token_cap


def apportion(total: int, weights: Sequence[int]) -> list[int]:
    """``total`` split in proportion to ``weights``, in whole numbers adding up to it
    (largest remainders first)."""
    weight = sum(weights)
    if not weights:
        return []
    if weight <= 0:
        weights, weight = [1] * len(weights), len(weights)
    exact = [total * w / weight for w in weights]
    shares = [int(x) for x in exact]
    left = total - sum(shares)
    for i in sorted(range(len(exact)), key=lambda i: exact[i] - shares[i], reverse=True)[:left]:
        shares[i] += 1
    return shares
