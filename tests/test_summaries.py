"""What sluice says about a job is true: the summary's counts equal what a rerun does,
figures carry no float noise, and nothing prints an object's address."""

from __future__ import annotations

import re
import signal
from pathlib import Path

from clitools import MODEL, questions, read_output, run_cli, start_cli, wait_until, write_jsonl
from fake_provider import dead_url

from sluice import Deployment, Engine
from sluice.store import SqliteStore
from sluice.testing import FakeServer


def test_not_done_after_ctrl_c_is_what_the_rerun_sends(server: FakeServer, tmp_path: Path) -> None:
    server.latency = 0.05
    source = write_jsonl(tmp_path / "in.jsonl", questions(400))
    output = tmp_path / "out.jsonl"
    args = ["run", source, "-o", output, "--model", MODEL, "--concurrency", "4"]
    process = start_cli(server, *args)
    wait_until(lambda: server.stats.accepted >= 30)
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


def test_the_run_summary_names_a_deployment_that_was_down_with_its_last_error(
    server: FakeServer, tmp_path: Path
) -> None:
    config = tmp_path / "sluice.toml"
    config.write_text(
        f'[[deployment]]\nmodel = "big"\nbase_url = "{dead_url()}"\n\n'
        f'[[deployment]]\nmodel = "{MODEL}"\nbase_url = "{server.url}"\n\n'
        f'[fallbacks]\n"big" = ["{MODEL}"]\n'
    )
    source = write_jsonl(tmp_path / "in.jsonl", questions(40))
    done = run_cli(server, "run", source, "-o", tmp_path / "out.jsonl", "--config", config, "--model", "big")
    assert done.returncode == 0, done.stderr
    (row,) = [line for line in done.stdout.splitlines() if line.strip().startswith("deployment big")]
    assert "cooling down" in row
    assert "last error connection_error: cannot connect to big" in row


def test_report_counts_every_run_and_says_which_is_the_last(server: FakeServer, tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", questions(30))
    output = tmp_path / "out.jsonl"
    assert run_cli(server, "run", source, "-o", output, "--model", MODEL).returncode == 0
    assert run_cli(server, "run", source, "-o", output, "--model", MODEL).returncode == 0  # sends nothing
    report = run_cli(server, "report", output)
    assert report.returncode == 0, report.stderr
    assert "answers over all 2 runs" in report.stdout
    (row,) = [line for line in report.stdout.splitlines() if line.strip().startswith(MODEL)]
    assert "30 answered" in row
    assert "(0 answered in the last run)" in row


def test_report_of_a_file_that_is_not_sluices_says_so(server: FakeServer, tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", questions(3))
    done = run_cli(server, "report", source)
    assert done.returncode == 2
    assert "is not a sluice output or state file" in done.stderr
    assert "move it aside" not in done.stderr
    import sqlite3

    other = tmp_path / "other.db"
    sqlite3.connect(other).execute("CREATE TABLE t (a)").connection.commit()
    done = run_cli(server, "report", other)
    assert done.returncode == 2
    assert "not a usable sluice state file" in done.stderr
    assert "move it aside" not in done.stderr


def test_report_of_a_running_job_counts_the_records_written_so_far(server: FakeServer, tmp_path: Path) -> None:
    server.latency = 0.05
    source = write_jsonl(tmp_path / "in.jsonl", questions(400))
    output = tmp_path / "out.jsonl"
    process = start_cli(server, "run", source, "-o", output, "--model", MODEL, "--concurrency", "4")
    try:
        wait_until(lambda: output.exists() and len(output.read_bytes().splitlines()) >= 40)
        state = SqliteStore(tmp_path / "out.sluice.db", readonly=True)
        try:  # the job notes its progress in its state every 2 s: until a note counts those 40
            wait_until(lambda: _noted_written(state) >= 40)
        finally:
            state.close()
        report = run_cli(server, "report", output)
    finally:
        process.send_signal(signal.SIGINT)
        process.communicate(timeout=60)
    assert report.returncode == 0, report.stderr
    assert "running (pid" in report.stdout
    match = re.search(r"records written\s+([\d,]+) \(as of", report.stdout)
    assert match is not None, report.stdout
    assert int(match.group(1).replace(",", "")) >= 40


def _noted_written(state: SqliteStore) -> int:
    """The records written, as the running job last noted them in its state (-1: no note yet)."""
    meta = state.meta()
    written = meta.get("written")
    return written if isinstance(written, int) and meta.get("deployments_at") else -1


def test_the_live_line_fits_an_80_column_terminal(server: FakeServer, tmp_path: Path) -> None:
    """Issue 34 point 29: on an 80-column terminal the live line wrapped (its ETA drawn on a
    second line, the pair redrawn and scrolled); now each frame is one line, the least
    needed figures left out."""
    import fcntl
    import os
    import pty
    import struct
    import subprocess
    import termios
    import time

    from clitools import env_for, sluice_cmd

    server.latency = 0.05
    source = write_jsonl(tmp_path / "in.jsonl", questions(400))
    parent, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    env = {k: v for k, v in env_for(server).items() if k not in ("COLUMNS", "LINES")}
    args = ["run", source, "-o", tmp_path / "out.jsonl", "--model", MODEL, "--concurrency", "4", "--budget", "5"]
    process = subprocess.Popen(
        sluice_cmd(*args, "--price", "2,8"), env=env, stdin=child, stdout=child, stderr=child, close_fds=True
    )
    os.close(child)
    screen = b""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            chunk = os.read(parent, 65536)
        except OSError:  # the command ended and closed the terminal
            break
        if not chunk:
            break
        screen += chunk
    os.close(parent)
    assert process.wait(timeout=60) == 0
    text = re.sub(r"\x1b\[[0-9;]*m", "", screen.decode("utf-8", "replace"))  # colours
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "\n", text)  # cursor moves: a frame ends
    frames = [line for line in re.split(r"[\r\n]+", text) if "/400 (" in line]
    assert frames, text[-2000:]
    for frame in frames:
        assert len(frame.rstrip()) <= 80, frame
        assert "ETA" in frame, frame  # the line's end is on the line, not wrapped to the next


def test_batch_answers_have_no_made_up_latency(server: FakeServer, tmp_path: Path) -> None:
    """Point 29: a --tier batch job's summary and report said "latency p50 0.000s" (lines
    read back from a batch's results were timed at 0); they are not timed one by one."""
    server.prices = {"*": (1.0, 2.0)}
    source = write_jsonl(tmp_path / "in.jsonl", questions(150))
    out = tmp_path / "out.jsonl"
    args = ["run", source, "-o", out, "--model", MODEL, "--tier", "batch", "--poll-every", "0.2", "--price", "1,2"]
    done = run_cli(server, *args, "--batch-size", "25")
    assert done.returncode == 0, done.stderr
    assert {r["tier"] for r in read_output(out)} == {"batch"}
    for text in (done.stdout, run_cli(server, "report", out).stdout):
        (latency,) = [line for line in text.splitlines() if line.strip().startswith("latency")]
        assert "n/a: batch answers are not timed one by one" in latency, text
        assert "0.000s" not in text


async def test_report_of_a_store_the_library_made_says_what_is_known(tmp_path: Path) -> None:
    """Point 29: it said "status unknown" and "records in input 0" of a store that no job made."""
    import asyncio

    from clitools import sluice_cmd

    path = tmp_path / "lib.db"
    store = SqliteStore(path)
    async with Engine([Deployment("simulate/demo", rpm=6000)], store=store) as engine:
        async for result in engine.map([f"q{i}" for i in range(4)], model="simulate/demo"):
            assert result.ok
    store.close()
    process = await asyncio.create_subprocess_exec(
        *sluice_cmd("report", path), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    stdout, stderr = await process.communicate()
    assert process.returncode == 0, stderr
    text = stdout.decode()
    assert "a program using the library" in text
    assert "answers stored  4" in text
    assert "unknown" not in text
    assert "records in input" not in text
