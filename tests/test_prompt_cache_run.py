"""``sluice run`` and ``sluice estimate`` with the prompt-cache planner, as a user runs them:
the command as a subprocess, the fake provider over loopback billing as Anthropic does."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from cachejobs import document_qa
from clitools import env_for, read_output, run_cli, start_cli, wait_until, write_jsonl

from sluice.batch._cache_plan import plan_file
from sluice.batch._inputs import InputOptions
from sluice.batch._output import DoneLines
from sluice.store import SqliteStore
from sluice.testing import FakeServer

CLAUDE = "anthropic/claude-sonnet-4-5"


@pytest.fixture
def fake_prices() -> dict[str, tuple[float, float]]:
    return {"claude-sonnet-4-5": (3.0, 15.0)}


def _lines(**shape: Any) -> list[dict[str, Any]]:
    return [{k: v for k, v in line.items() if k != "model"} for line in document_qa("claude-sonnet-4-5", **shape)]


def _env(server: FakeServer) -> dict[str, str]:
    return env_for(server, ANTHROPIC_BASE_URL=server.anthropic_url, ANTHROPIC_API_KEY="sk-test")


def _run(server: FakeServer, source: Path, output: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    done = run_cli(server, "run", source, "-o", output, "--model", CLAUDE, *extra, env=_env(server), timeout=300)
    assert done.returncode == 0, done.stderr
    return done


def test_the_document_qa_job_bills_a_third_of_itself_uncached_as_its_estimate_says(
    server: FakeServer, tmp_path: Path
) -> None:
    server.latency = 0.1
    source = write_jsonl(tmp_path / "in.jsonl", _lines())
    _run(server, source, tmp_path / "off.jsonl", "--prompt-cache", "off")
    uncached = server.total_billed_usd
    done = _run(server, source, tmp_path / "on.jsonl")
    cached = server.total_billed_usd - uncached
    assert cached <= 0.35 * uncached, (cached, uncached)
    records = read_output(tmp_path / "on.jsonl")
    assert sum(r["cost_usd"] for r in records) == pytest.approx(cached)  # what the fake billed
    assert "prompt cache" in done.stdout
    assert "duplicate writes" in done.stdout
    estimate = run_cli(server, "estimate", source, "--model", CLAUDE, "--json", env=_env(server))
    assert estimate.returncode == 0, estimate.stderr
    figures = json.loads(estimate.stdout)
    assert (figures["requests"], figures["records"]) == (240, 240)
    assert figures["input_tokens"] == pytest.approx(sum(r["usage"]["input_tokens"] for r in records), rel=0.1)
    assert figures["cost_usd"] == pytest.approx(cached, rel=0.25)
    assert figures["cost_usd_without_cache"] == pytest.approx(uncached, rel=0.25)
    report = run_cli(server, "report", tmp_path / "on.jsonl", env=_env(server))
    assert "prompt cache" in report.stdout
    assert "saved" in report.stdout


def test_ordered_output_keeps_input_order_and_still_reads_the_cache(server: FakeServer, tmp_path: Path) -> None:
    lines = _lines(documents=6)
    source = write_jsonl(tmp_path / "in.jsonl", lines)
    _run(server, source, tmp_path / "out.jsonl", "--ordered", "--concurrency", "8")
    records = read_output(tmp_path / "out.jsonl")
    assert [r["line"] for r in records] == list(range(1, len(lines) + 1))
    read = sum(r["usage"]["cached_input_tokens"] for r in records)
    assert read >= 0.8 * sum(r["usage"]["input_tokens"] for r in records)


def test_the_plan_sends_each_group_together_in_20_bytes_a_line(tmp_path: Path) -> None:
    lines = _lines(documents=5, questions=4)
    source = write_jsonl(tmp_path / "in.jsonl", lines)
    plan = plan_file(source, InputOptions(model=CLAUDE), DoneLines(), reorder=True)
    assert plan is not None
    order = [number for number, _ in plan.order()]
    assert sorted(order) == list(range(1, 21))
    documents = [lines[n - 1]["messages"][1]["content"].split(":")[0] for n in order]  # "Document 3"
    runs = [documents[i] for i in range(len(documents)) if i == 0 or documents[i] != documents[i - 1]]
    assert len(runs) == 5  # one run of lines per document
    assert plan.group_count == 5
    assert plan.numbers is not None
    assert plan.offsets is not None
    assert plan.groups is not None
    assert plan.numbers.itemsize + plan.offsets.itemsize + plan.groups.itemsize == 20
    done = DoneLines()
    for number in order[:4]:  # the first group, answered by a run before
        done.add(number)
    again = plan_file(source, InputOptions(model=CLAUDE), done, reorder=True)
    assert again is not None
    assert [n for n, _ in again.order()] == order[4:]  # a rerun plans the same order over what is left


def test_a_kill_mid_job_loses_nothing_and_the_rerun_plans_again(server: FakeServer, tmp_path: Path) -> None:
    """kill -9 while the groups' lines are being answered: the rerun answers every line once
    more at most for those that were in flight, and its groups prime and read again."""
    server.latency = 0.3
    lines = _lines(documents=12, questions=6)
    source = write_jsonl(tmp_path / "in.jsonl", lines)
    output = tmp_path / "out.jsonl"
    args = ["run", source, "-o", output, "--model", CLAUDE, "--concurrency", "8"]
    first = start_cli(server, *args, env=_env(server), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: len(server.ledger) >= 30 and server.in_flight >= 2, timeout=120)
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
    finally:
        if first.poll() is None:
            first.kill()
    wait_until(lambda: server.in_flight == 0)
    state = SqliteStore(tmp_path / "out.sluice.db", readonly=True)
    (in_flight,) = state._db.execute("SELECT count(*) FROM intents").fetchone()
    state.close()
    before = len(server.ledger)
    rerun = run_cli(server, *args, env=_env(server), timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    records = read_output(output)
    assert sorted(r["line"] for r in records) == list(range(1, len(lines) + 1))  # every line, once
    assert len(server.ledger) <= len(lines) + in_flight  # paid twice only for what was in flight
    assert len(server.ledger) - before < len(lines)
    assert "prompt cache" in rerun.stdout
    assert server.prompt_cache.stats.hits >= len(server.ledger) - before - 12 - in_flight


_MEMORY = textwrap.dedent(
    """
    import json, sys, tracemalloc
    from pathlib import Path
    from sluice.batch import _cache_plan
    from sluice.batch._inputs import InputOptions
    from sluice.batch._output import DoneLines
    from sluice.caching._index import PrefixIndex

    _cache_plan.PrefixIndex = lambda: PrefixIndex(most=2000)  # a small cap, reached early
    path, lines = Path(sys.argv[1]), int(sys.argv[2])
    with path.open("w") as f:
        for i in range(lines):
            f.write(json.dumps({"messages": [{"role": "user", "content": f"{i} " + "word " * 900}]}) + "\\n")
    tracemalloc.start()
    plan = _cache_plan.plan_file(path, InputOptions(model="anthropic/claude-sonnet-4-5"), DoneLines(), reorder=True)
    print(tracemalloc.get_traced_memory()[1], len(plan.index))
    """
)


def test_the_plan_of_a_long_input_keeps_flat_memory(tmp_path: Path) -> None:
    """Peak memory of the plan over 4,000 and 16,000 lines of unshared long prompts: the
    index stays at its cap, the plan grows by its arrays (a few bytes a line)."""
    peaks = []
    for lines in (4000, 16000):
        done = subprocess.run(
            [sys.executable, "-c", _MEMORY, str(tmp_path / f"in{lines}.jsonl"), str(lines)],
            capture_output=True,
            text=True,
            check=True,
            timeout=300,
        )
        peak, entries = map(int, done.stdout.split())
        assert entries <= 2000
        peaks.append(peak)
    assert peaks[1] - peaks[0] < 12_000 * 200  # well under 200 bytes a line more
