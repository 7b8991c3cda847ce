"""What sluice says about a job is true: the summary's counts equal what a rerun does,
figures carry no float noise, and nothing prints an object's address."""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from clitools import MODEL, questions, read_output, run_cli, start_cli, write_jsonl

from sluice import Deployment, Engine
from sluice.testing import FakeServer


@pytest.fixture
def server() -> Iterator[FakeServer]:
    with FakeServer(api_key="sk-test").running_in_thread() as fake:
        yield fake


def test_not_done_after_ctrl_c_is_what_the_rerun_sends(server: FakeServer, tmp_path: Path) -> None:
    server.latency = 0.05
    source = write_jsonl(tmp_path / "in.jsonl", questions(400))
    output = tmp_path / "out.jsonl"
    args = ["run", source, "-o", output, "--model", MODEL, "--concurrency", "4"]
    process = start_cli(server, *args)
    deadline = time.monotonic() + 30
    while server.stats.accepted < 30 and time.monotonic() < deadline:
        time.sleep(0.01)
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    match = re.search(r"not done\s+([\d,]+) \(a rerun does them\)", stdout)
    assert match is not None, stdout
    left = int(match.group(1).replace(",", ""))
    written = len(read_output(output))
    assert left == 400 - written  # lines never read count too
    before = server.stats.received
    server.latency = 0.0
    done = run_cli(server, *args)
    assert done.returncode == 0, done.stderr
    assert server.stats.received - before == left  # every line differs: one request each
    assert len(read_output(output)) == 400


def test_costs_in_records_carry_no_float_noise(server: FakeServer, tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", questions(60, max_tokens=7))
    output = tmp_path / "out.jsonl"
    done = run_cli(server, "run", source, "-o", output, "--model", MODEL, "--price", "0.15,0.6")
    assert done.returncode == 0, done.stderr
    costs = [r["cost_usd"] for r in read_output(output)]
    assert all(cost > 0 for cost in costs)
    noisy = [cost for cost in costs if float(f"{cost:.12g}") != cost]
    assert noisy == []


async def test_engine_stats_print_as_figures_not_addresses() -> None:
    async with Engine([Deployment("simulate/demo")]) as engine:
        await engine.complete("simulate/demo", "hi")
        text = repr(engine.stats)
    assert "object at 0x" not in text
    assert "LatencyHistogram(count=1, p50=" in text


def test_progress_says_eta_0_at_100_percent() -> None:
    from sluice.batch._job import JobProgress
    from sluice.cli._progress import status_line

    progress = JobProgress(total=10, already_done=10)
    assert "ETA 0:00" in status_line(progress)
    assert "ETA ?" not in status_line(progress)
