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
