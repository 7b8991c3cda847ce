"""The batch tier in-process, against the fake's Batches API: orderings a job run through
the command cannot time (a line asked again at the instant its batch's answer is being
journalled)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from fake_provider import deployment_at

from sluice import MovedToSyncError, Request
from sluice._errors import ParkedError
from sluice.store import SqliteStore
from sluice.testing import FakeServer
from sluice.tiers import BatchSettings, BatchTier


class SlowJournal(SqliteStore):
    """A real journal whose result saves wait for ``release`` (``saving`` is set meanwhile)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.saving = asyncio.Event()
        self.release = asyncio.Event()

    async def save_batch_results(self, chunk: int, batch_id: str, lines: list[tuple[str, bytes]]) -> None:  # type: ignore[override]
        self.saving.set()
        await self.release.wait()
        await super().save_batch_results(chunk, batch_id, lines)


async def test_a_line_asked_again_while_its_batch_answer_is_journalled_reads_that_answer(
    server: FakeServer, tmp_path: Path
) -> None:
    """The deadline moves the lines of a running batch; the batch is cancelled having
    answered some. A line asked again while those answers are being saved must get its
    batch's answer, not be sent synchronously as well (billed twice and not counted)."""
    server.batches.lines_per_second = 10
    journal = SlowJournal(tmp_path / "state.db")
    left = [0]  # the plan moves the lines once the job says this many are left
    ended: list[int] = []
    settings = BatchSettings(
        poll_every=0.05,
        linger=0.05,
        deadline=time.time() + 60,
        sync_rate=1.0,
        remaining=lambda: left[0],
        on_ended=ended.append,
    )
    deployment = deployment_at(server, "openai/gpt-4o-mini")
    tier = BatchTier(deployment, journal, settings)
    requests = [Request(deployment.model, [{"role": "user", "content": f"question {i}"}]) for i in range(10)]
    keys = [f"line-{i}" for i in range(10)]
    try:
        sent = await asyncio.gather(
            *(tier.send(r, deployment, idempotency_key=k) for r, k in zip(requests, keys, strict=True)),
            return_exceptions=True,
        )
        assert all(isinstance(e, ParkedError) for e in sent), sent  # the batch is created: they left memory
        await server.until(lambda: server.stats.accepted >= 3)
        left[0] = 1000  # the rest cannot be answered in time (sync could beat the 24 h window): moved
        await asyncio.wait_for(journal.saving.wait(), 30)  # collected: its answers on their way to the journal
        assert ended, "the moved chunk's lines were not asked again"
        answered = set(server.stats.succeeded_keys)
        again = [
            asyncio.ensure_future(tier.send(r, deployment, idempotency_key=k))
            for r, k in zip(requests, keys, strict=True)
        ]
        await asyncio.sleep(0.1)
        journal.release.set()
        outcomes = await asyncio.gather(*again, return_exceptions=True)
    finally:
        journal.release.set()
        await tier.aclose()
        journal.close()
    by_key = dict(zip(keys, outcomes, strict=True))
    assert 3 <= len(answered) < 10
    for key, outcome in by_key.items():
        if key in answered:  # the batch answered it: read back, not sent again
            assert not isinstance(outcome, BaseException), (key, outcome)
            assert outcome.read_back
        else:
            assert isinstance(outcome, MovedToSyncError), (key, outcome)
    assert not tier.answered_after_move
    assert server.stats.duplicate_successes == 0


@pytest.fixture
def fake_prices() -> dict[str, tuple[float, float]]:
    return {"*": (1.0, 2.0)}


@pytest.mark.parametrize(("left", "moved"), [(200_000, False), (5_000, True)])
async def test_the_deadline_moves_lines_only_when_sync_would_beat_the_batch_window(
    server: FakeServer, tmp_path: Path, left: int, moved: bool
) -> None:
    """An hour's deadline at 1 request a second (the rate assumed without an rpm): 5,000
    lines left (~1.6 h synchronously) move to sync, but 200,000 (~64 h, longer than the
    batch's own 24 h window) keep to the batch, which answers them (sync could not help)."""
    server.batches.start_after = 1.0  # the plan looks at the time (every 0.05 s) before the batch answers
    journal = SqliteStore(tmp_path / "state.db")
    settings = BatchSettings(
        poll_every=0.05, linger=0.05, deadline=time.time() + 3600, sync_rate=1.0, remaining=lambda: left
    )
    deployment = deployment_at(server, "openai/gpt-4o-mini")
    tier = BatchTier(deployment, journal, settings)
    requests = [Request(deployment.model, [{"role": "user", "content": f"question {i}"}]) for i in range(5)]
    try:
        outcomes = await asyncio.wait_for(
            asyncio.gather(
                *(tier.send(r, deployment, idempotency_key=f"line-{i}") for i, r in enumerate(requests)),
                return_exceptions=True,
            ),
            30,
        )
    finally:
        await tier.aclose()
        journal.close()
    assert tier.moved is moved
    if moved:
        assert all(isinstance(o, MovedToSyncError) for o in outcomes), outcomes
    else:
        assert not any(isinstance(o, BaseException) for o in outcomes), outcomes
        assert len(set(server.stats.succeeded_keys)) == 5  # answered by the batch
