"""The README's Python examples run as they are written: a new user pastes them first."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def _runnable_blocks() -> list[str]:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.DOTALL)
    return [block for block in blocks if "asyncio.run(main())" in block]


def test_the_readme_has_the_examples_this_test_runs() -> None:
    assert len(_runnable_blocks()) >= 2  # the first library example and the session one


@pytest.mark.parametrize("index", range(2))
def test_a_readme_example_runs_without_an_api_key(index: int, tmp_path: Path) -> None:
    code = _runnable_blocks()[index]
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and k != "OPENAI_BASE_URL"}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout.strip()
