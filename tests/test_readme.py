"""The README's Python examples run as they are written: a new user pastes them first."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sluice.testing import FakeServer

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


def test_the_readmes_export_columns_are_the_real_header(server: FakeServer, tmp_path: Path) -> None:
    """Issue 34 point 29: the README's ``export --csv`` column list had drifted from the
    header export writes; the list is read from the README and held to a real export's."""
    import csv

    from clitools import MODEL, questions, run_cli, write_jsonl

    text = README.read_text(encoding="utf-8")
    bullet = text[text.index("- **`sluice export OUTPUT --csv FILE`**") :]
    bullet = bullet[: bullet.index("then `parsed`")]
    documented = re.findall(r"`([a-z_]+)`", bullet)
    lines = [{**q, "metadata": {"source": "test"}} for q in questions(2)]
    source = write_jsonl(tmp_path / "in.jsonl", lines)
    out, table = tmp_path / "out.jsonl", tmp_path / "out.csv"
    assert run_cli(server, "run", source, "-o", out, "--model", MODEL).returncode == 0
    assert run_cli(server, "export", out, "--csv", table).returncode == 0
    with table.open(newline="") as f:
        header = next(csv.reader(f))
    assert header == [c for c in documented if c != "reasks"] + ["metadata.source"]  # reasks: only with a schema
