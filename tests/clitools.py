"""Helpers for tests that run the ``sluice`` command as a subprocess against a FakeServer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sluice.testing import FakeServer

MODEL = "openai/gpt-test"


def sluice_cmd(*args: str | Path) -> list[str]:
    return [sys.executable, "-m", "sluice", *map(str, args)]


def env_for(server: FakeServer, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "OPENAI_BASE_URL": server.url,
        "OPENAI_API_KEY": "sk-test",
        "NO_COLOR": "1",
        **extra,
    }


def run_cli(
    server: FakeServer, *args: str | Path, timeout: float = 60, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        sluice_cmd(*args), env=env or env_for(server), capture_output=True, text=True, timeout=timeout
    )


#: Every command start_cli started during the current test (reaped after it by conftest).
started: list[subprocess.Popen[str]] = []


def start_cli(server: FakeServer, *args: str | Path, **popen: Any) -> subprocess.Popen[str]:
    popen.setdefault("stdout", subprocess.PIPE)
    popen.setdefault("stderr", subprocess.PIPE)
    process = subprocess.Popen(sluice_cmd(*args), env=popen.pop("env", None) or env_for(server), text=True, **popen)
    started.append(process)
    return process


def reap_started() -> None:
    """Kill what a test left running and close every pipe it left open: a test that fails
    half-way must not leave a process behind, nor unclosed files whose ResourceWarning the
    garbage collector raises later, in whichever test is running then."""
    while started:
        process = started.pop()
        if process.poll() is None:
            process.kill()
        try:
            process.communicate(timeout=30)
        except ValueError:  # its pipes were already read to the end and closed
            process.wait(timeout=30)


def write_jsonl(path: Path, records: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def questions(n: int, *, start: int = 0, max_tokens: int = 20) -> list[dict[str, Any]]:
    return [
        {"messages": [{"role": "user", "content": f"question {i}"}], "max_tokens": max_tokens}
        for i in range(start, start + n)
    ]


def read_output(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def wait_until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    """Until ``condition()`` holds (the server, in its thread, moves on meanwhile)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for the condition")
        time.sleep(0.005)
