"""What the batch tier is told (:class:`BatchSettings`) and where it journals what it
submits (:class:`BatchJournal`, which :class:`~sluice.store.SqliteStore` is)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ..store._batches import Chunk

__all__ = ["BatchJournal", "BatchSettings"]


@dataclass(frozen=True, slots=True)
class BatchSettings:
    """How the batch tier submits and waits."""

    #: The most seconds between two looks at a running batch (see ``_polling``).
    poll_every: float = 30.0
    #: Lines per batch (OpenAI takes up to 50,000, Anthropic 100,000): also about how many
    #: lines wait in memory.
    max_lines: int = 10_000
    #: Bytes of one batch's input file (OpenAI takes up to 200 MB).
    max_bytes: int = 190 * 1024 * 1024
    #: Seconds without a new line before a chunk that is not full is submitted.
    linger: float = 2.0
    #: ``--tier auto``: when (Unix time) every line must be answered; None: no deadline.
    deadline: float | None = None
    #: Lines a second the model's synchronous deployment can answer (its limits), for the plan.
    sync_rate: float = 1.0
    #: Lines of the job not answered yet (all of them, read or not), for the plan.
    remaining: Callable[[], int] | None = None
    #: Parking (set by a job that can ask a line again, see ``ParkedError``): a line leaves
    #: memory once its batch is created and journalled, and this is told each chunk whose
    #: batch has ended (its lines' outcomes journalled): its lines are then asked again.
    #: None: a line's ``send`` waits for its batch (at most two batches' lines wait).
    on_ended: Callable[[int], None] | None = None

    def __post_init__(self) -> None:
        if not self.poll_every > 0:
            raise ValueError(f"poll_every must be a positive number of seconds, got {self.poll_every!r}")
        if not 1 <= self.max_lines <= 100_000:
            raise ValueError(f"batch size must be 1 to 100,000 lines, got {self.max_lines!r}")
        if not self.linger >= 0:
            raise ValueError(f"linger must be >= 0 seconds, got {self.linger!r}")


class BatchJournal(Protocol):
    """Where the submission protocol writes (a :class:`~sluice.store.SqliteStore`)."""

    def batch_job_id(self) -> str: ...
    async def new_chunk(self, deployment: str, custom_ids: list[str]) -> int: ...
    async def note_batch(self, chunk: int, batch_id: str | None, status: str) -> None: ...
    async def save_batch_results(self, chunk: int, batch_id: str, lines: list[tuple[str, bytes]]) -> None: ...
    def open_chunks(self, deployment: str | None = None) -> list[Chunk]: ...
    def line_state(self, custom_id: str) -> tuple[tuple[str, bytes, int] | None, Chunk | None]: ...
    def chunk_ids(self, chunk: int) -> tuple[str, ...]: ...
