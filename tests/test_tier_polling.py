"""Polling that follows a provider batch: soon when its counts say it is about to end,
seldom while it waits, never later than ``--poll-every``."""

from __future__ import annotations

from pathlib import Path

import pytest
from clitools import MODEL, questions, read_output, run_cli, write_jsonl

from sluice.testing import FakeServer
from sluice.tiers._polling import Polls


def _waits(every: float, looks: list[tuple[float, tuple[int, int] | None]]) -> list[float]:
    polls = Polls(every)
    return [round(polls.wait(now, progress), 3) for now, progress in looks]


@pytest.mark.parametrize(
    ("looks", "waits"),
    [
        # queued, never moving: 1, 2, 4, ... up to --poll-every
        ([(t, (0, 100)) for t in range(8)], [1, 2, 4, 8, 16, 30, 30, 30]),
        # no counts at all: the same
        ([(0, None), (1, None), (3, None)], [1, 2, 4]),
        # moving at 10 lines a second, 1,000 lines: seen at t=5 (50 done), then at t=7 (70 done): 93 s left
        ([(5, (50, 1000)), (7, (70, 1000))], [1, 30]),
        # nearly done: 20 lines left at 10 a second: in 2 s
        ([(5, (50, 1000)), (100, (980, 1000))], [1, 2.043]),
        # every line done (finalizing): a second
        ([(0, (1000, 1000))], [1]),
        # a long --poll-every is only a maximum: 30 lines left at 1 a second
        ([(0, (10, 100)), (60, (70, 100))], [1, 30]),
    ],
)
def test_the_wait_follows_the_batch(looks: list[tuple[float, tuple[int, int] | None]], waits: list[float]) -> None:
    assert _waits(30.0, looks) == waits


def test_never_past_poll_every_nor_below_it_when_it_is_short() -> None:
    assert _waits(0.2, [(0, (0, 10)), (1, (0, 10)), (2, (5, 10)), (3, (9, 10)), (4, (10, 10))]) == [0.2] * 5
    assert max(_waits(600.0, [(t, (t, 10**6)) for t in range(1, 40)])) == 600.0


def test_a_batch_that_ends_in_seconds_is_collected_long_before_poll_every(server: FakeServer, tmp_path: Path) -> None:
    """30 lines answered 10 a second (~3 s), polled every 300 s at most: the job ends within
    the minute (it waited for the 300 s before)."""
    server.batches.lines_per_second = 10.0
    src = write_jsonl(tmp_path / "in.jsonl", questions(30))
    out = tmp_path / "out.jsonl"
    done = run_cli(
        server, "run", src, "-o", out, "--model", MODEL, "--tier", "batch", "--poll-every", "300", timeout=60
    )
    assert done.returncode == 0, done.stderr
    records = read_output(out)
    assert len(records) == 30
    assert {r["tier"] for r in records} == {"batch"}
    assert all(r["ok"] for r in records)
