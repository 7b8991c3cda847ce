"""The quality gates run with the suite, so CI holds them too."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    "command",
    [
        ["ruff", "check", "src", "tests", "bench"],
        ["ruff", "format", "--check", "src", "tests", "bench"],
        [sys.executable, "-m", "mypy", "--strict", "src/sluice"],
    ],
    ids=["ruff-check", "ruff-format", "mypy-strict"],
)
def test_gate(command: list[str]) -> None:
    if command[0] == "ruff" and shutil.which("ruff") is None:
        command = [sys.executable, "-m", *command]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


#: What a run leaves behind: never part of the repository (every clone would share it, and
#: running the code would modify tracked files).
_RUN_TIME_STATE = (".sluice-serve/", ".sluice.db", ".db", ".db-wal", ".db-shm", "replica-id", "results.jsonl")


def test_no_run_time_state_is_tracked() -> None:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    done = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    tracked = [path for path in done.stdout.splitlines() if any(part in path for part in _RUN_TIME_STATE)]
    assert tracked == []
    paths = [".sluice-serve/engine.db", ".sluice-serve/replica-id", "x.sluice.db", "state.db"]
    ignored = subprocess.run(["git", "check-ignore", *paths], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert ignored.stdout.split() == paths  # each is ignored, so a run never dirties the tree
