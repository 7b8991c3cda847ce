"""``--tier batch`` with more lines at the provider than fit in memory: a line leaves the
process once its batch is created and journalled, and is read from the input again when
that batch ends. Checked against the fake's own record of its batches (when each was
created and ended, what each held) and its ledger."""

from __future__ import annotations

import contextlib
import json
import math
import re
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from clitools import (
    MODEL,
    env_for,
    questions,
    read_output,
    run_cli,
    sluice_cmd,
    start_cli,
    wait_until,
    write_jsonl,
)

from sluice.testing import FakeServer

PRICE = (1.0, 2.0)
BATCH = ("--tier", "batch", "--poll-every", "0.2", "--price", "1,2")


@pytest.fixture
def fake_prices() -> dict[str, tuple[float, float]]:
    return {"*": PRICE}


def _batches(server: FakeServer) -> list[Any]:
    return list(server.batches.batches.values())


def _most_open_at_once(server: FakeServer) -> int:
    """The most batches that were open together, by the fake's own stamps."""
    spans = []
    for batch in _batches(server):
        end = batch.stamps.get("completed_at") or batch.stamps.get("expired_at") or batch.stamps.get("cancelled_at")
        spans.append((batch.stamps["created_at"], end if end is not None else float("inf")))
    return max(sum(1 for start, end in spans if start <= t < end) for t, _ in spans)


def _answered_once(server: FakeServer, out: Path, n: int) -> list[dict[str, Any]]:
    records = read_output(out)
    assert sorted(r["line"] for r in records) == list(range(1, n + 1))
    assert all(r["ok"] for r in records), [r["error"] for r in records if not r["ok"]][:3]
    assert {r["tier"] for r in records} == {"batch"}
    assert server.stats.received == 0  # nothing synchronous
    assert server.stats.duplicate_successes == 0
    return records


def _recorded_batches(state: Path) -> int:
    with contextlib.closing(sqlite3.connect(state)) as db:
        try:
            return int(db.execute("SELECT count(*) FROM tier_chunks WHERE batch_id IS NOT NULL").fetchone()[0])
        except sqlite3.OperationalError:
            return 0


def test_every_batch_of_the_job_waits_at_the_provider_at_once(server: FakeServer, tmp_path: Path) -> None:
    """Twelve batches of 20 lines, none started before all are made: a job whose engine
    holds at most two batches' lines (40) still puts all 240 at the provider together."""
    server.batches.start_after = 4.0
    src, out = write_jsonl(tmp_path / "in.jsonl", questions(240)), tmp_path / "out.jsonl"
    done = run_cli(server, "run", src, "-o", out, "--model", MODEL, *BATCH, "--batch-size", "20", timeout=90)
    assert done.returncode == 0, done.stderr
    records = _answered_once(server, out, 240)
    assert len(_batches(server)) == 12
    assert _most_open_at_once(server) == 12
    assert sum(r["cost_usd"] for r in records) == pytest.approx(server.total_billed_usd, rel=1e-6)
    assert {r["attempts"] for r in records} == {1}
    assert re.search(r"requests sent\s+240 \(0 retries", done.stdout), done.stdout  # once each, not twice


def test_the_budget_bounds_what_waits_at_the_provider(server: FakeServer, tmp_path: Path) -> None:
    """A parked line keeps its worst case reserved: the lines at the provider at once are
    what the budget can pay for at worst, and the rest go as answers settle below it."""
    server.batches.start_after = 1.0
    n = 120
    src, out = write_jsonl(tmp_path / "in.jsonl", questions(n, max_tokens=200)), tmp_path / "out.jsonl"
    budget = 0.005  # ~23 lines at their worst case (200 output tokens at $1/Mtok, the batch price)
    args = ("--batch-size", "10", "--budget", f"{budget}")
    done = run_cli(server, "run", src, "-o", out, "--model", MODEL, *BATCH, *args, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    _answered_once(server, out, n)
    assert server.total_billed_usd <= budget
    first_end = min(b.stamps["completed_at"] for b in _batches(server))
    before = sum(len(b.lines) for b in _batches(server) if b.stamps["created_at"] < first_end)
    assert 0 < before <= budget / (200 * PRICE[1] / 2 / 1e6)  # never more than the budget's worst case
    assert len(_batches(server)) > 3  # the rest followed as money came back


def test_kill_9_with_many_batches_open_then_the_rerun_collects_every_one(server: FakeServer, tmp_path: Path) -> None:
    server.batches.start_after = 3.0
    src, out = write_jsonl(tmp_path / "in.jsonl", questions(100)), tmp_path / "out.jsonl"
    state = out.with_suffix(".sluice.db")
    job = start_cli(server, "run", src, "-o", out, "--model", MODEL, *BATCH, "--batch-size", "10")
    try:
        wait_until(lambda: _recorded_batches(state) >= 6, timeout=60)
    finally:
        job.kill()
        job.communicate()
    made = len(_batches(server))
    assert server.stats.accepted == 0
    done = run_cli(server, "run", src, "-o", out, "--model", MODEL, *BATCH, "--batch-size", "10", timeout=90)
    assert done.returncode == 0, done.stdout + done.stderr
    _answered_once(server, out, 100)
    assert server.stats.accepted == 100  # no line answered twice by the batches
    assert sum(len(b.lines) for b in _batches(server)) == 100  # nor submitted twice
    assert len(_batches(server)) <= made + 4


def test_identical_lines_go_to_the_provider_once(server: FakeServer, tmp_path: Path) -> None:
    """The second of two identical lines comes while the first waits in a batch: it waits
    for that batch too (a line out of memory is still known to the journal)."""
    server.batches.start_after = 1.0
    lines = questions(30) + questions(30)
    src, out = write_jsonl(tmp_path / "in.jsonl", lines), tmp_path / "out.jsonl"
    done = run_cli(server, "run", src, "-o", out, "--model", MODEL, *BATCH, "--batch-size", "10", timeout=90)
    assert done.returncode == 0, done.stderr
    records = read_output(out)
    assert len(records) == 60
    assert all(r["ok"] for r in records)
    assert sum(len(b.lines) for b in _batches(server)) == 30
    assert server.stats.accepted == 30


def test_a_line_every_batch_fails_gives_up_after_five_batches(server: FakeServer, tmp_path: Path) -> None:
    server.batches.fail_lines(10_000, status=500)
    src, out = write_jsonl(tmp_path / "in.jsonl", questions(4)), tmp_path / "out.jsonl"
    done = run_cli(server, "run", src, "-o", out, "--model", MODEL, *BATCH, "--batch-size", "1", timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    records = read_output(out)
    assert len(records) == 4
    assert not any(r["ok"] for r in records)
    assert all("5 batches did not answer it" in r["error"]["message"] for r in records), records[0]["error"]
    assert {r["attempts"] for r in records} == {5}
    assert len(_batches(server)) == 4 * 5  # a batch a line (--batch-size 1), five times
    again = run_cli(server, "run", src, "-o", out, "--model", MODEL, *BATCH, "--batch-size", "1", timeout=60)
    assert len(_batches(server)) > 20, again.stderr  # a rerun tries again


def test_a_job_that_fits_in_memory_waits_there(server: FakeServer, tmp_path: Path) -> None:
    """Parking costs a line a second pass through the engine: a job of no more than two
    batches' worth keeps its lines waiting in memory (each line sent once, as before)."""
    src, out = write_jsonl(tmp_path / "in.jsonl", questions(40)), tmp_path / "out.jsonl"
    done = run_cli(server, "run", src, "-o", out, "--model", MODEL, *BATCH, "--batch-size", "20", timeout=60)
    assert done.returncode == 0, done.stderr
    _answered_once(server, out, 40)
    assert re.search(r"requests sent\s+40 \(0 retries", done.stdout), done.stdout


def test_ordered_output_keeps_the_lines_in_memory_and_in_order(server: FakeServer, tmp_path: Path) -> None:
    src, out = write_jsonl(tmp_path / "in.jsonl", questions(45)), tmp_path / "out.jsonl"
    args = ("--batch-size", "10", "--ordered")
    done = run_cli(server, "run", src, "-o", out, "--model", MODEL, *BATCH, *args, timeout=90)
    assert done.returncode == 0, done.stderr
    assert [r["line"] for r in read_output(out)] == list(range(1, 46))
    _answered_once(server, out, 45)


def test_strict_stops_a_parked_job_at_its_bad_line_without_hanging(server: FakeServer, tmp_path: Path) -> None:
    """The lines before the bad one are collected from their batches, then the job stops."""
    lines = [json.dumps(q) for q in questions(100)]
    lines[79] = "not json"
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("\n".join(lines) + "\n")
    args = ("--batch-size", "10", "--strict")
    done = run_cli(server, "run", src, "-o", out, "--model", MODEL, *BATCH, *args, timeout=60)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "line 80: not valid JSON" in done.stderr
    records = read_output(out)
    assert sorted(r["line"] for r in records) == list(range(1, 80))
    assert all(r["ok"] for r in records)
    assert server.stats.duplicate_successes == 0


def test_a_line_the_batch_rejects_is_recorded_once_and_retry_failed_sends_it_again(
    server: FakeServer, tmp_path: Path
) -> None:
    """The request's own failure (a 400 inside the batch) is that line's record, counted as
    one request; ``--retry-failed`` sends it again in a new batch (the state's copy of the
    old verdict is not an answer to a new ask)."""
    server.batches.reject = lambda body: "rejected" if "REJECT" in json.dumps(body) else None
    bad = [{"messages": [{"role": "user", "content": f"REJECT {i}"}], "max_tokens": 20} for i in range(3)]
    lines = questions(15) + bad + questions(12, start=50)
    src, out = write_jsonl(tmp_path / "in.jsonl", lines), tmp_path / "out.jsonl"
    args = ("--batch-size", "5")
    done = run_cli(server, "run", src, "-o", out, "--model", MODEL, *BATCH, *args, timeout=60)
    assert done.returncode == 1, done.stdout + done.stderr
    failed = [r for r in read_output(out) if not r["ok"]]
    assert sorted(r["line"] for r in failed) == [16, 17, 18]
    assert {r["error"]["type"] for r in failed} == {"bad_request"}
    assert {r["attempts"] for r in failed} == {1}
    submitted = [line.custom_id for b in _batches(server) for line in b.lines]
    assert len(submitted) == len(set(submitted)) == 30  # none resubmitted
    assert re.search(r"requests sent\s+30 \(0 retries", done.stdout), done.stdout
    server.batches.reject = None
    again = run_cli(server, "run", src, "-o", out, "--model", MODEL, *BATCH, *args, "--retry-failed", timeout=60)
    assert again.returncode == 0, again.stdout + again.stderr
    assert all(r["ok"] for r in read_output(out))
    assert sum(len(b.lines) for b in _batches(server)) == 33


def test_auto_moves_lines_parked_at_a_create_the_token_limit_refused(server: FakeServer, tmp_path: Path) -> None:
    """Only one batch fits the enqueued-token limit and none starts: the refused chunks'
    lines were parked at their first create; the deadline's move must ask them too."""
    server.batches.start_after = math.inf
    server.batches.enqueued_token_limit = 200
    src, out = write_jsonl(tmp_path / "in.jsonl", questions(30)), tmp_path / "out.jsonl"
    auto = ("--tier", "auto", "--poll-every", "0.2", "--price", "1,2", "--rpm", "1200")
    args = ("--batch-size", "5", "--deadline", "15s")
    done = run_cli(server, "run", src, "-o", out, "--model", MODEL, *auto, *args, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    records = read_output(out)
    assert sorted(r["line"] for r in records) == list(range(1, 31))
    assert {r["tier"] for r in records} == {"sync"}
    assert server.batches.open_batches == []
    assert server.stats.duplicate_successes == 0


def test_lines_waiting_for_money_leave_room_for_the_parked_ones_to_come_back(
    server: FakeServer, tmp_path: Path
) -> None:
    """More lines than the engine runs at once wait for money that only parked lines can
    give back (by being answered): those must still get into the engine."""
    n = 200
    src, out = write_jsonl(tmp_path / "in.jsonl", questions(n, max_tokens=200)), tmp_path / "out.jsonl"
    budget = 0.005  # ~23 lines at their worst case; the others wait for what they give back
    args = ("--batch-size", "10", "--concurrency", "1", "--budget", f"{budget}")  # 20 lines in the engine at once
    done = run_cli(server, "run", src, "-o", out, "--model", MODEL, *BATCH, *args, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    _answered_once(server, out, n)
    assert server.total_billed_usd <= budget


def _peak_rss_mb(server: FakeServer, tmp_path: Path, n: int) -> float:
    """A parked job of ``n`` lines run to its end; the peak RSS the kernel counted for it."""
    src = write_jsonl(tmp_path / f"in-{n}.jsonl", questions(n))
    out = tmp_path / f"out-{n}.jsonl"
    command = sluice_cmd("run", src, "-o", out, "--model", MODEL, *BATCH, "--log-every", "600")
    # The peak is counted by a small parent of the job: a child forked from this (large)
    # test process would count this process's pages, held until its exec, as its own peak.
    measure = (
        "import resource, subprocess, sys; "
        "code = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode; "
        "print(code, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", measure, *map(str, command)],
            env=env_for(server),
            capture_output=True,
            text=True,
            timeout=400,
        )
    except subprocess.TimeoutExpired:
        raise AssertionError(f"a {n:,}-line job did not end within 400 s") from None
    returncode, peak_kb = (int(word) for word in done.stdout.split())
    assert returncode == 0, done.stderr
    with out.open("rb") as records:
        assert sum(b'"ok":true' in record for record in records) == n
    return peak_kb / 1024


@pytest.mark.timeout(900)
def test_a_parked_jobs_memory_does_not_grow_with_its_lines(server: FakeServer, tmp_path: Path) -> None:
    """Three times the lines, the same memory: what grew per batch (each parked line's error
    holding its engine frames in a cycle) is gone, and a line leaves the engine as it joins
    a chunk (before: two batches' worth of lines waited as engine tasks, ~10 KB each)."""
    small = _peak_rss_mb(server, tmp_path, 25_000)
    large = _peak_rss_mb(server, tmp_path, 75_000)
    assert large < 250, f"75,000 lines peaked at {large:.0f} MB (25,000 at {small:.0f} MB)"
    assert large < small + 110, f"75,000 lines peaked at {large:.0f} MB, 25,000 at {small:.0f} MB"
