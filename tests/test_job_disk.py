"""Issue 34 point 22: a job on a disk that fills. It stops while the disk still has room
for the answers it has in flight, so none it was paid for is lost and sent again; when
another process fills the disk faster than that, it says exactly which answers it could
keep nowhere, and the provider's bill over the rerun agrees.

Real small file systems: a tmpfs mounted for the test (it needs root; skipped, saying
so, where mounting is refused)."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from clitools import MODEL, questions, read_output, run_cli, start_cli, wait_until, write_jsonl

from sluice.testing import FakeServer


@contextlib.contextmanager
def small_disk(path: Path, size: str) -> Iterator[Callable[[str], None]]:
    """A tmpfs of ``size`` at ``path``; yields a function that resizes it."""
    path.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (root is needed): {mounted.stderr.decode().strip()}")

    def resize(new: str) -> None:
        subprocess.run(["mount", "-o", f"remount,size={new}", str(path)], check=True)

    try:
        yield resize
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill(directory: Path) -> None:
    """Take every free byte of the file system of ``directory`` (as another process would)."""
    fd = os.open(directory / "filler", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"\0" * 65536)
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"\0" * 512)
    finally:
        os.close(fd)


def rerun_with_room(
    server: FakeServer, args: list[str | Path], small: Path, resize: Callable[[str], None], lines: int
) -> subprocess.CompletedProcess[str]:
    """The filler gone and the disk larger, the same command again: it finishes the job,
    one record per line in the output."""
    (small / "filler").unlink(missing_ok=True)
    resize("256m")
    second = run_cli(server, *args, timeout=120)
    assert second.returncode == 0, second.stderr
    assert sorted(r["line"] for r in read_output(small / "out.jsonl")) == list(range(1, lines + 1))
    return second


def job(tmp_path: Path, lines: int, concurrency: int, *flags: str | Path) -> tuple[Path, Path, list[str | Path]]:
    """A job of ``lines`` questions whose output is on ``small`` (mounted by the test): the
    small disk's path, the output and the command's arguments."""
    small = tmp_path / "small"
    source = write_jsonl(tmp_path / "in.jsonl", questions(lines))
    output = small / "out.jsonl"
    return small, output, ["run", source, "-o", output, *flags, "--model", MODEL, "--concurrency", str(concurrency)]


def test_a_disk_too_small_for_the_answers_in_flight_stops_the_job_before_it_sends(
    server: FakeServer, tmp_path: Path
) -> None:
    """The new user's run: 3,000 lines at the default concurrency on a 400 KB disk. Before,
    it ran until the disk was full and lost answers it had paid for; now it sends nothing
    and says why."""
    small = tmp_path / "small"
    source = write_jsonl(tmp_path / "in.jsonl", questions(3000))
    with small_disk(small, "400k"):
        done = run_cli(server, "run", source, "-o", small / "out.jsonl", "--model", MODEL)
    assert done.returncode == 3, done.stderr
    assert "Traceback" not in done.stderr
    assert "the disk is nearly full" in done.stderr
    assert "lower --concurrency" in done.stderr
    assert "rerun the same command" in done.stderr
    assert server.stats.received == 0


def test_a_filling_disk_stops_the_job_with_room_left_and_nothing_is_paid_twice(
    server: FakeServer, tmp_path: Path
) -> None:
    """The job fills the disk itself: it stops while there is room for what is in flight,
    writes every answer it received, and the rerun (on a larger disk) sends none again."""
    server.latency = 0.02
    small, output, args = job(tmp_path, 1500, 32)
    with small_disk(small, "2m") as resize:
        first = run_cli(server, *args, timeout=120)
        assert first.returncode == 3, first.stderr
        assert "Traceback" not in first.stderr
        assert "the disk is nearly full" in first.stderr
        assert "Every answer received is kept" in first.stderr
        sent = server.stats.accepted
        assert 0 < sent < 1500
        assert len(read_output(output)) == sent  # every answer received is in the output
        second = rerun_with_room(server, args, small, resize, 1500)
    assert "in flight when the last run stopped" not in second.stderr
    assert server.stats.duplicate_successes == 0
    assert server.stats.accepted == 1500


def test_a_disk_another_process_fills_is_met_with_the_room_kept_aside(server: FakeServer, tmp_path: Path) -> None:
    """Another process takes every free byte between two checks: the first write refused
    frees the room the job kept aside, the job stops, and what it had in flight lands
    there; the rerun sends nothing twice."""
    server.latency = 0.01
    small, output, args = job(tmp_path, 3000, 64)
    with small_disk(small, "16m") as resize:
        process = start_cli(server, *args)
        wait_until(lambda: server.stats.accepted >= 300)
        fill(small)
        _, stderr = process.communicate(timeout=120)
        assert process.returncode == 3, stderr
        assert "Traceback" not in stderr
        assert "Every answer received is kept" in stderr
        sent = server.stats.accepted
        assert len(read_output(output)) == sent
        rerun_with_room(server, args, small, resize, 3000)
    assert server.stats.duplicate_successes == 0
    assert server.stats.accepted == 3000


def _count(pattern: str, text: str) -> int:
    found = re.search(pattern, text)
    return int(found.group(1).replace(",", "")) if found else 0


def run_kept_full(server: FakeServer, args: list[str | Path], small: Path) -> str:
    """Run the job while another process keeps ``small`` full once 300 answers are in; it
    stops itself (exit 3) without a traceback. Its standard error."""
    process = start_cli(server, *args)

    def keep_full() -> None:
        wait_until(lambda: server.stats.accepted >= 300)
        while process.poll() is None:
            fill(small)

    filler = threading.Thread(target=keep_full)
    filler.start()
    _, stderr = process.communicate(timeout=120)
    filler.join(timeout=60)
    assert process.returncode == 3, stderr
    assert "Traceback" not in stderr
    return str(stderr)


def test_a_disk_another_process_keeps_full_says_which_answers_are_sent_again(
    server: FakeServer, tmp_path: Path
) -> None:
    """Another process keeps the disk full (it takes the room kept aside too): the state and
    the output both fail. The closing message says how many answers are in the state only
    and which could be kept nowhere; the rerun serves the first from the state and sends
    exactly the second again (the provider counts them as its duplicates)."""
    server.latency = 0.01
    small, output, args = job(tmp_path, 3000, 64)
    with small_disk(small, "16m") as resize:
        stderr = run_kept_full(server, args, small)
        assert "Every answer is in the state file" not in stderr  # the old claim, whatever happened
        in_state = _count(r"(\d[\d,]*) answers are in the state only", stderr)
        lost = _count(r"(\d[\d,]*) answers received could be kept in neither", stderr)
        written = len(read_output(output))
        second = rerun_with_room(server, args, small, resize, 3000)
    assert server.stats.duplicate_successes == lost  # exactly the answers it said are sent again
    assert _count(r"served from the state\s+(\d[\d,]*)", second.stdout) == in_state
    assert written + in_state + lost <= 3000


def test_an_output_disk_another_process_keeps_full_leaves_every_answer_in_the_state(
    server: FakeServer, tmp_path: Path
) -> None:
    """Only the output's disk fills (the state is elsewhere): every answer received is in
    the state, the closing message says so, and the rerun writes them without sending
    them again."""
    server.latency = 0.01
    small, output, args = job(tmp_path, 3000, 64, "--state", tmp_path / "state.db")
    with small_disk(small, "16m") as resize:
        stderr = run_kept_full(server, args, small)
        assert "answers received could be kept in neither" not in stderr
        sent = server.stats.accepted
        in_state = _count(r"(\d[\d,]*) answers are in the state only", stderr)
        assert len(read_output(output)) + in_state == sent
        if in_state:
            assert "cannot write the output" in stderr
            assert "No space left on device" in stderr
            assert "the rerun sends none of them again" in stderr
        second = rerun_with_room(server, args, small, resize, 3000)
    assert server.stats.duplicate_successes == 0
    assert server.stats.accepted == 3000
    assert _count(r"served from the state\s+(\d[\d,]*)", second.stdout) == in_state
