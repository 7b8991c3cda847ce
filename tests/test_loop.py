"""The commands' event loop: uvloop where installed, asyncio's own when asked; the
library never picks one."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from clitools import MODEL, questions, read_output, sluice_cmd, write_jsonl

from sluice._errors import ConfigError
from sluice.cli._loop import loop_factory, run_on_loop
from sluice.testing import FakeServer


def test_uvloop_is_the_commands_loop_unless_asyncio_is_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    uvloop = pytest.importorskip("uvloop")
    monkeypatch.delenv("SLUICE_LOOP", raising=False)
    assert loop_factory() is uvloop.new_event_loop

    async def kind() -> str:
        return type(asyncio.get_running_loop()).__module__

    assert run_on_loop(kind()).startswith("uvloop")
    monkeypatch.setenv("SLUICE_LOOP", "asyncio")
    assert loop_factory() is None
    assert run_on_loop(kind()).startswith("asyncio")
    monkeypatch.setenv("SLUICE_LOOP", "trio")
    with pytest.raises(ConfigError, match="SLUICE_LOOP must be auto, uvloop or asyncio"):
        loop_factory()


@pytest.mark.parametrize("loop", ["auto", "asyncio"])
def test_sluice_run_works_on_either_loop(tmp_path: Path, loop: str) -> None:
    with FakeServer(api_key="sk-test").running_in_thread() as server:
        source = write_jsonl(tmp_path / "in.jsonl", questions(20))
        env = {**os.environ, "OPENAI_BASE_URL": server.url, "OPENAI_API_KEY": "sk-test", "SLUICE_LOOP": loop}
        done = subprocess.run(
            sluice_cmd("run", source, "-o", tmp_path / "out.jsonl", "--model", MODEL),
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 0, done.stderr
    assert len(read_output(tmp_path / "out.jsonl")) == 20


def test_importing_sluice_picks_no_loop() -> None:
    code = "import sluice, sys; print('uvloop' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "False"
