"""``--tier auto`` against its deadline, under a budget: the lines of the batches it cancels
wait for what those batches answered, every answer the fake billed reaches the output
once, the money held for parked lines comes back as their batches end, and lines the
batches keep failing go synchronously while there is time. Checked against the fake's
own bill (its ledger) and its record of its batches."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from clitools import MODEL, questions, read_output, run_cli, write_jsonl

from sluice.testing import FakeServer

#: The fake's batches start 5 s after they are created.
START_AFTER = 5.0
AUTO = ("--tier", "auto", "--price", "1,2", "--rpm", "6000", "--batch-size", "200", "--poll-every", "1")


@pytest.fixture
def fake_prices() -> dict[str, tuple[float, float]]:
    return {"*": (1.0, 2.0)}


def _slow_batches(server: FakeServer, lines_per_second: float) -> None:
    server.batches.start_after = START_AFTER
    server.batches.lines_per_second = lines_per_second  # each batch


def _billed_once_and_delivered(server: FakeServer, records: list[dict[str, Any]]) -> None:
    """Every answer the fake billed is a record's answer, once; the records' costs are its bill."""
    assert server.stats.duplicate_successes == 0
    answered = [r for r in records if r["ok"]]
    assert len(answered) == len(server.ledger)  # no billed answer left in the state only
    for tier in ("batch", "sync"):
        assert sum(1 for r in answered if r["tier"] == tier) == sum(1 for e in server.ledger if e.tier == tier), tier
    assert sum(r["cost_usd"] or 0.0 for r in records) == pytest.approx(server.total_billed_usd, rel=1e-9, abs=1e-12)


def _summary_says_what_was_billed(server: FakeServer, stdout: str) -> None:
    """The summary's cost of this run's answers, and each tier's lines and cost, are the fake's."""
    cost = re.search(r"cost +\$([\d.]+) answers this run", stdout)
    assert cost is not None, stdout
    assert float(cost.group(1)) == pytest.approx(server.total_billed_usd, rel=0.01)
    for tier in ("batch", "sync"):
        entries = [e for e in server.ledger if e.tier == tier]
        shown = re.search(rf"{tier} ([\d,]+) \(\$([\d.]+)\)", stdout)
        assert shown is not None, stdout
        assert int(shown.group(1).replace(",", "")) == len(entries), tier
        assert float(shown.group(2)) == pytest.approx(sum(e.cost_usd for e in entries), rel=0.01), tier
    assert "answered twice" not in stdout


def _money_left(stdout: str) -> float:
    """The summary's "$X left" of the budget."""
    found = re.search(r"budget \$[\d.]+, \$([\d.]+) left", stdout)
    assert found is not None, stdout
    return float(found.group(1))


def test_a_tight_budget_finishes_by_the_deadline_with_every_billed_answer_delivered(
    server: FakeServer, tmp_path: Path
) -> None:
    """The issue's run (batches that start after 5 s, 20 lines a second): the budget
    cannot pay for every line even at the batch price. It must not hang (it did: lines
    moved from the cancelled batches waited for money that parked lines held), every
    answer billed must reach the output (half of them did not), and the lines it cannot
    pay for end ``budget_exhausted``."""
    _slow_batches(server, 20.0)
    n, budget = 1000, 0.02  # all 1,000 lines by batch would be billed $0.021
    src, out = write_jsonl(tmp_path / "in.jsonl", questions(n)), tmp_path / "out.jsonl"
    args = ("--deadline", "40s", "--budget", str(budget))
    done = run_cli(server, "run", src, "-o", out, "--model", MODEL, *AUTO, *args, timeout=100)  # a hang fails here
    assert done.returncode == 4, done.stdout + done.stderr  # some lines did not fit the budget
    records = read_output(out)
    assert sorted(r["line"] for r in records) == list(range(1, n + 1))
    _billed_once_and_delivered(server, records)
    assert server.total_billed_usd <= budget
    assert {r["error"]["type"] for r in records if not r["ok"]} == {"budget_exhausted"}
    assert sum(1 for r in records if r["ok"]) > n // 4  # the budget is used, not held
    # nothing is still held at the end: what is left is the budget less what was billed
    assert _money_left(done.stdout) == pytest.approx(budget - server.total_billed_usd, rel=0.01, abs=1e-6)
    assert server.batches.open_batches == []
    assert "answered twice" not in done.stdout


def test_the_records_and_the_summary_say_what_the_fake_billed(server: FakeServer, tmp_path: Path) -> None:
    """With room in the budget, the lines of the cancelled batches (5 lines a second each)
    are answered by them or synchronously, never both: no line carries a batch attempt's
    worst case, and the summary claims nothing answered twice."""
    _slow_batches(server, 5.0)
    n, budget = 1000, 1.0
    src, out = write_jsonl(tmp_path / "in.jsonl", questions(n)), tmp_path / "out.jsonl"
    args = ("--deadline", "40s", "--budget", str(budget))
    done = run_cli(server, "run", src, "-o", out, "--model", MODEL, *AUTO, *args, timeout=100)
    assert done.returncode == 0, done.stdout + done.stderr
    records = read_output(out)
    assert sorted(r["line"] for r in records) == list(range(1, n + 1))
    assert all(r["ok"] for r in records)
    _billed_once_and_delivered(server, records)
    assert {r["tier"] for r in records} == {"batch", "sync"}
    assert _money_left(done.stdout) == pytest.approx(budget - server.total_billed_usd, abs=1e-4)  # shown to 4 decimals
    _summary_says_what_was_billed(server, done.stdout)


@pytest.mark.parametrize("size", [(), ("--batch-size", "1")], ids=["in-memory", "parked"])
def test_lines_the_batches_keep_failing_go_synchronously_while_there_is_time(
    server: FakeServer, tmp_path: Path, size: tuple[str, ...]
) -> None:
    """Every batch fails every line (a 500 inside the batch): after five batches a line
    goes synchronously, the deadline an hour away, rather than failing."""
    server.batches.fail_lines(10_000, status=500)
    src, out = write_jsonl(tmp_path / "in.jsonl", questions(4)), tmp_path / "out.jsonl"
    auto = ("--tier", "auto", "--price", "1,2", "--rpm", "600", "--poll-every", "0.2", "--deadline", "1h")
    done = run_cli(server, "run", src, "-o", out, "--model", MODEL, *auto, *size, timeout=100)
    assert done.returncode == 0, done.stdout + done.stderr
    records = read_output(out)
    assert len(records) == 4
    assert all(r["ok"] for r in records), [r["error"] for r in records if not r["ok"]]
    assert {r["tier"] for r in records} == {"sync"}
    assert server.stats.received == 4  # each line synchronously once
    if size:  # parked: each line in five batches (in memory, the failures cool the batch deployment first)
        assert sum(len(b.lines) for b in server.batches.batches.values()) == 4 * 5
