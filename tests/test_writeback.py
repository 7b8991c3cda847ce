"""``--tier batch`` parked lines written back from the state (``sluice.batch._writeback``):
a line its batch answered plainly is written from its journalled result without a second
pass through the engine. Checked against the engine's own pass (the same job with the
write-back turned off, in a second process), the state file and the fake's ledger."""

from __future__ import annotations

import contextlib
import json
import re
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from clitools import MODEL, env_for, questions, read_output, run_cli, start_cli, write_jsonl

from sluice.testing import FakeServer

PRICE = (1.0, 2.0)
BATCH = ("--tier", "batch", "--poll-every", "0.2", "--price", "1,2")
SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string"}},
    "required": ["answer"],
    "additionalProperties": False,
}
#: ``sluice`` with the write-back turned off: every parked line takes the engine's pass.
ENGINE_PASS = (
    "import sys\n"
    "from sluice.batch._writeback import WriteBack\n"
    "async def engine_pass(self, items): return items\n"
    "WriteBack.write = engine_pass\n"
    "from sluice._entry import main\n"
    "sys.argv[0] = 'sluice'\n"
    "main()\n"
)


@pytest.fixture
def fake_prices() -> dict[str, tuple[float, float]]:
    return {"*": PRICE}


def _mixed(n: int) -> list[dict[str, Any]]:
    """Plain lines, lines with a schema of their own, and lines the batch rejects."""
    lines: list[dict[str, Any]] = []
    for i, line in enumerate(questions(n)):
        if i % 7 == 3:
            line["response_format"] = {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}
        elif i % 11 == 5:
            line["messages"][0]["content"] = f"REJECT {i}"
        line["metadata"] = {"i": i}
        lines.append(line)
    return lines


def _engine_pass(server: FakeServer, *args: str | Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-c", ENGINE_PASS, *map(str, args)]
    return subprocess.run(command, env=env_for(server), capture_output=True, text=True, timeout=120)


def _comparable(record: dict[str, Any]) -> dict[str, Any]:
    """A record without what differs between two runs of one job: the time a read took,
    the batch's id, and the completion's own id and time."""
    record = dict(record)
    record.pop("latency_s", None)
    batch = record.pop("batch_id", None)
    assert batch is None or str(batch).startswith("batch")
    for key in ("response", "raw"):
        if isinstance(record.get(key), dict):
            record[key] = {k: v for k, v in record[key].items() if k not in ("id", "created")}
    return record


def _state(path: Path) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], int]:
    """The state's results (comparable), its charges by key (rows, dollars), and open intents."""
    with contextlib.closing(sqlite3.connect(path)) as db:
        results = [
            (key, ok, error, tokens_in, tokens_out, cost, attempts, _comparable(json.loads(record)))
            for key, ok, error, tokens_in, tokens_out, cost, attempts, record in db.execute(
                "SELECT key, ok, error_type, input_tokens, output_tokens, cost_usd, attempts, record FROM results"
                " ORDER BY key"
            )
        ]
        charges = db.execute(
            "SELECT key, count(*), sum(answered_usd), sum(maybe_billed_usd) FROM charges GROUP BY key ORDER BY key"
        ).fetchall()
        (intents,) = db.execute("SELECT count(*) FROM intents").fetchone()
    return results, charges, int(intents)


def _written_back(stdout: str) -> int:
    found = re.search(r"written back\s+([\d,]+) answers", stdout)
    return int(found.group(1).replace(",", "")) if found else 0


@pytest.mark.parametrize("budget", [(), ("--budget", "1")], ids=["no budget", "budget"])
def test_written_back_lines_equal_the_engines_pass(server: FakeServer, tmp_path: Path, budget: tuple[str, ...]) -> None:
    """Plain lines, schema lines and rejected ones in parked batches: every record and
    every stored result is the engine's pass's, field by field; only the plain answers are
    written back (the summary counts them), the rest take the engine's pass as before."""
    server.batches.start_after = 1.0
    server.batches.reject = lambda body: "rejected" if "REJECT" in json.dumps(body) else None
    n = 90
    lines = _mixed(n)
    plain = sum(1 for i in range(n) if i % 7 != 3 and i % 11 != 5)
    runs = {}
    for name in ("back", "engine"):
        folder = tmp_path / name
        folder.mkdir()
        src, out = write_jsonl(folder / "in.jsonl", lines), folder / "out.jsonl"
        args = ("run", src, "-o", out, "--model", MODEL, *BATCH, "--batch-size", "10", *budget)
        done = run_cli(server, *args, timeout=120) if name == "back" else _engine_pass(server, *args)
        assert done.returncode == 1, done.stdout + done.stderr  # the rejected lines failed
        runs[name] = (
            done.stdout,
            sorted(read_output(out), key=lambda r: r["line"]),
            _state(out.with_suffix(".sluice.db")),
        )
    back, engine = runs["back"], runs["engine"]
    assert _written_back(back[0]) == plain
    assert _written_back(engine[0]) == 0
    assert [r["line"] for r in back[1]] == list(range(1, n + 1))
    assert [_comparable(r) for r in back[1]] == [_comparable(r) for r in engine[1]]
    assert all(r["latency_s"] == 0.0 for r in back[1] if r["ok"] and "parsed" not in r)  # nothing was sent
    kinds = {(r["ok"], "parsed" in r, (r["error"] or {}).get("type")) for r in back[1]}
    assert kinds == {(True, False, None), (True, True, None), (False, False, "bad_request")}
    assert back[2] == engine[2]  # results, charges (one row a key), no intent left
    assert back[2][2] == 0
    assert all(rows == 1 for _, rows, _, _ in back[2][1])


def test_the_budget_counts_each_written_back_answer_once(server: FakeServer, tmp_path: Path) -> None:
    """Under a budget the batch's bill is counted when the batch ends; the write-back
    charges the state once per answer, and what the job says it spent is the fake's bill."""
    server.batches.start_after = 1.0
    n = 80
    src, out = write_jsonl(tmp_path / "in.jsonl", questions(n, max_tokens=50)), tmp_path / "out.jsonl"
    done = run_cli(server, "run", src, "-o", out, "--model", MODEL, *BATCH, "--batch-size", "10", "--budget", "0.5")
    assert done.returncode == 0, done.stdout + done.stderr
    assert _written_back(done.stdout) == n
    records = read_output(out)
    assert sorted(r["line"] for r in records) == list(range(1, n + 1))
    billed = server.total_billed_usd
    assert sum(r["cost_usd"] for r in records) == pytest.approx(billed, rel=1e-9)
    _, charges, intents = _state(out.with_suffix(".sluice.db"))
    assert intents == 0
    assert len(charges) == n
    assert all(rows == 1 for _, rows, _, _ in charges)
    assert sum(usd for _, _, usd, _ in charges) == pytest.approx(billed, rel=1e-9)
    assert sum(maybe for _, _, _, maybe in charges) == 0
    again = run_cli(server, "run", src, "-o", out, "--model", MODEL, *BATCH, "--batch-size", "10", "--budget", "0.5")
    assert again.returncode == 0, again.stdout + again.stderr
    assert server.total_billed_usd == billed  # the rerun sends nothing
    assert len(_state(out.with_suffix(".sluice.db"))[1]) == n


def _count_lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def test_kill_9_during_the_write_back_then_the_rerun_sends_and_charges_nothing_again(
    server: FakeServer, tmp_path: Path
) -> None:
    """The job is killed (SIGKILL) once the write-back has written some of its lines, not
    all; the rerun writes the rest from the state: no line sent or billed again, none
    lost, each answer charged once."""
    server.batches.start_after = 1.0
    n = 3000
    src, out = write_jsonl(tmp_path / "in.jsonl", questions(n)), tmp_path / "out.jsonl"
    args = ("run", src, "-o", out, "--model", MODEL, *BATCH, "--batch-size", "250")
    job = start_cli(server, *args)
    deadline = time.monotonic() + 90
    try:
        while not 0 < _count_lines(out) < n:
            assert job.poll() is None, "the job ended before it could be killed mid-write-back"
            assert time.monotonic() < deadline
            time.sleep(0.005)
    finally:
        job.kill()
        job.communicate()
    at_kill = _count_lines(out)
    assert 0 < at_kill < n
    done = run_cli(server, *args, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    records = read_output(out)
    assert sorted(r["line"] for r in records) == list(range(1, n + 1))  # nothing lost, nothing twice
    assert all(r["ok"] for r in records)
    assert server.stats.received == 0  # nothing synchronous
    assert sum(len(b.lines) for b in server.batches.batches.values()) == n  # no line submitted twice
    assert server.stats.accepted == n  # nor answered twice
    assert server.stats.duplicate_successes == 0
    _, charges, intents = _state(out.with_suffix(".sluice.db"))
    assert intents == 0
    assert len(charges) == n
    assert all(rows == 1 for _, rows, _, _ in charges)
    assert sum(usd for _, _, usd, _ in charges) == pytest.approx(server.total_billed_usd, rel=1e-9)
