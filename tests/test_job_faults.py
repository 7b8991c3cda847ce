"""Issue 7 under faults: kill -9, a full disk, hangs at a stop. The budget holds over
every run as the provider bills it; an answer that was paid for is never dropped; a stop
ends within its grace; and the rerun says what may have been paid twice."""

from __future__ import annotations

import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from clitools import MODEL, env_for, questions, read_output, run_cli, sluice_cmd, start_cli, wait_until, write_jsonl

from sluice.store import SqliteStore
from sluice.testing import FakeServer


def _kill_when(process: subprocess.Popen[str], condition: object) -> None:
    try:
        wait_until(condition)  # type: ignore[arg-type]
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()


def test_a_crash_cannot_reset_the_budget(server: FakeServer, tmp_path: Path) -> None:
    """Points 4 and 17: requests in flight at a kill -9 are counted (at their worst case)
    by the rerun, which says they may be billed twice; the provider's bill over both runs
    stays inside the budget."""
    server.prices = {"gpt-test": (2.0, 8.0)}
    server.latency = 0.3
    budget = 0.004
    source = write_jsonl(tmp_path / "in.jsonl", questions(200))
    args = [
        "run", source, "-o", tmp_path / "out.jsonl", "--model", MODEL, "--price", "2,8",
        "--concurrency", "8", "--budget", str(budget),
    ]  # fmt: skip
    first = start_cli(server, *args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _kill_when(first, lambda: server.stats.accepted >= 16 and server.in_flight >= 4)
    wait_until(lambda: server.in_flight == 0)  # the provider finishes (and bills) what the dead client left behind
    state = SqliteStore(tmp_path / "out.sluice.db", readonly=True)
    (open_intents,) = state._db.execute("SELECT count(*) FROM intents").fetchone()
    state.close()
    assert open_intents >= 4  # noted before they were sent
    second = run_cli(server, *args)
    assert second.returncode in (0, 4), second.stderr
    assert f"{open_intents} requests were in flight when the last run stopped" in second.stderr
    assert "may be billed twice" in second.stderr
    assert server.total_billed_usd <= budget


def test_charges_of_possibly_billed_attempts_survive_every_rerun(server: FakeServer, tmp_path: Path) -> None:
    """Point 4: failed attempts the provider billed stay counted after --retry-failed."""
    server.prices = {"gpt-test": (2.0, 8.0)}
    source = write_jsonl(tmp_path / "in.jsonl", questions(20))
    config = tmp_path / "sluice.toml"
    config.write_text("[retry]\nmax_attempts = 1\n")
    args = ["run", source, "-o", tmp_path / "out.jsonl", "--model", MODEL, "--price", "2,8", "--config", config]
    server.inject("truncated", times=5)  # billed by the provider, garbled for us
    first = run_cli(server, *args, "--budget", "1")
    assert first.returncode == 1, first.stderr
    assert "possibly billed" in first.stdout
    state = SqliteStore(tmp_path / "out.sluice.db", readonly=True)
    maybe_billed = state.spend().maybe_billed
    state.close()
    assert maybe_billed > 0
    for extra in ([], ["--retry-failed"]):
        run_cli(server, *args, "--budget", "1", *extra)
        state = SqliteStore(tmp_path / "out.sluice.db", readonly=True)
        assert state.spend().maybe_billed == pytest.approx(maybe_billed)
        assert state.spend().total >= server.total_billed_usd - 1e-12
        state.close()


def test_cost_counts_possibly_billed_attempts_without_a_budget(server: FakeServer, tmp_path: Path) -> None:
    """Point 20: the reported cost is never below what the provider billed."""
    server.prices = {"gpt-test": (2.0, 8.0)}
    server.inject("malformed", times=6)
    source = write_jsonl(tmp_path / "in.jsonl", questions(30))
    done = run_cli(server, "run", source, "-o", tmp_path / "out.jsonl", "--model", MODEL, "--price", "2,8")
    assert done.returncode == 0, done.stderr
    state = SqliteStore(tmp_path / "out.sluice.db", readonly=True)
    spend = state.spend()
    state.close()
    assert spend.maybe_billed > 0
    assert spend.total >= server.total_billed_usd - 1e-12
    assert "possibly billed" in done.stdout


def test_a_stop_has_a_bounded_grace(server: FakeServer, tmp_path: Path) -> None:
    """Point 21: SIGTERM with requests hanging at the provider ends within the grace; the
    rerun names them as in flight (maybe billed) and finishes the job."""
    source = write_jsonl(tmp_path / "in.jsonl", questions(20))
    output = tmp_path / "out.jsonl"
    args = ["run", source, "-o", output, "--model", MODEL, "--concurrency", "4", "--grace", "1"]
    server.inject("hang", times=4)
    process = start_cli(server, *args)
    try:
        wait_until(lambda: server.in_flight >= 4)
        stopped_at = time.monotonic()
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, stderr
    assert time.monotonic() - stopped_at < 10  # the grace (1 s) and shutdown; not the 600 s attempt timeout
    server.clear_faults()
    done = run_cli(server, *args)
    assert done.returncode == 0, done.stderr
    assert "4 requests were in flight when the last run stopped" in done.stderr
    assert sorted(r["line"] for r in read_output(output)) == list(range(1, 21))


def test_the_first_ctrl_c_sends_nothing_new_behind_a_long_pause(server: FakeServer, tmp_path: Path) -> None:
    """Point 7: requests waiting out a 429's pause are not sent after Ctrl-C."""
    server.inject("429", times=4, retry_after=40)
    source = write_jsonl(tmp_path / "in.jsonl", questions(50))
    args = ["run", source, "-o", tmp_path / "out.jsonl", "--model", MODEL, "--concurrency", "4"]
    process = start_cli(server, *args)
    try:
        wait_until(lambda: server.stats.rate_limited >= 4)
        time.sleep(0.2)
        received = server.stats.received
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=15)  # not the 40 s pause
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, stderr
    assert server.stats.received == received


def _limited_file_size(limit: int) -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


def test_a_full_disk_stops_the_job_cleanly_and_the_rerun_resumes(server: FakeServer, tmp_path: Path) -> None:
    """Points 2 and 18: the state cannot grow; the job stops, names the file and the
    error, exits 3, and keeps every answer it was paid for."""
    server.latency = 0.01
    source = write_jsonl(tmp_path / "in.jsonl", questions(1000))
    output = tmp_path / "out.jsonl"
    args = ["run", source, "-o", output, "--model", MODEL, "--concurrency", "8"]
    full = subprocess.run(
        sluice_cmd(*args),
        env=env_for(server, PYTHONDONTWRITEBYTECODE="1"),  # see the conftest's shared_bytecode_cache
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=lambda: _limited_file_size(300_000),  # full after a few dozen answers
    )
    assert full.returncode == 3, full.stderr
    assert "Traceback" not in full.stderr
    assert "out.sluice.db" in full.stderr or "out.jsonl" in full.stderr
    assert "rerun the same command" in full.stderr
    first_run = server.stats.accepted
    assert 0 < first_run < 1000
    done = run_cli(server, *args)
    assert done.returncode == 0, done.stderr
    assert sorted(r["line"] for r in read_output(output)) == list(range(1, 1001))
    assert server.stats.duplicate_successes <= 8  # at most what was in flight at the stop


def test_a_batch_of_records_the_output_cannot_take_is_cut_back_whole(tmp_path: Path) -> None:
    """A job writes each event-loop tick's records in one write; when the disk refuses the
    write part-way (EFBIG here, ENOSPC alike), the file is cut back to where it was, so it
    never ends in half a record and the job knows exactly which records it holds."""
    script = """
import json, resource, signal, sys
from pathlib import Path
from sluice.batch._output import OutputFile
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
out = OutputFile(Path(sys.argv[1]))
line = (json.dumps({"line": 1, "ok": True, "text": "x" * 300}) + "\\n").encode()
out.write_lines([line])
resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))
try:
    out.write_lines([line, line, line])
except OSError as exc:
    print("refused", exc.errno)
print(out.size, out.written)
"""
    path = tmp_path / "out.jsonl"
    done = subprocess.run([sys.executable, "-B", "-c", script, str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    refused, sizes = done.stdout.splitlines()
    assert refused == "refused 27"  # EFBIG: the second batch crossed the limit part-way
    one = len(path.read_bytes())
    assert sizes == f"{one} 1"
    assert path.read_bytes().count(b"\n") == 1
    assert path.read_bytes().endswith(b"\n")
