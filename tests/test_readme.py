"""The README's and the site's examples run as they are written: a new user pastes them first.

The README is the landing page (under 200 lines, every link resolving); the site's pages
(docs/) hold the rest. Every Python example with ``asyncio.run(main())`` in either runs; so
does every code block of the getting-started page, in order, as a new user would paste it.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sluice.testing import FakeServer

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
GETTING_STARTED = DOCS / "getting-started.md"
#: The suite's own command: the getting-started page names it, and this test is part of it.
SUITE_COMMAND = "pip install -e '.[test]' && python -m pytest"


def _pages() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def _runnable_blocks() -> list[tuple[str, str]]:
    found = []
    for page in _pages():
        for block in re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.DOTALL):
            if "asyncio.run(main())" in block:
                found.append((page.relative_to(ROOT).as_posix(), block))
    return found


def _no_keys() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and k != "OPENAI_BASE_URL"}


def test_the_docs_have_the_examples_this_test_runs() -> None:
    where = [page for page, _ in _runnable_blocks()]
    assert "README.md" in where
    assert "docs/getting-started.md" in where
    assert "docs/concepts/money.md" in where  # the session example
    assert len(where) >= 4


@pytest.mark.parametrize(
    ("page", "code"), _runnable_blocks(), ids=[f"{p}-{i}" for i, (p, _) in enumerate(_runnable_blocks())]
)
def test_a_docs_example_runs_without_an_api_key(page: str, code: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=_no_keys(), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, (page, done.stderr)
    assert "Traceback" not in done.stderr
    assert done.stdout.strip()


def test_the_readme_is_a_landing_page_whose_links_resolve() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) < 200
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    assert len(targets) >= 20
    local = [t for t in targets if "://" not in t]
    missing = [t for t in local if not (ROOT / t.split("#")[0]).exists()]
    assert missing == []
    assert SUITE_COMMAND in text  # .ci/run and this test rely on the exact commands
    assert "pip install -e . && sluice run examples/questions.jsonl -o results.jsonl --model simulate/demo" in text


def _blocks(page: Path) -> list[tuple[str, str]]:
    return re.findall(r"```(\w+)\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.DOTALL)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_listening(port: int, server: subprocess.Popen[str], deadline_s: float = 60.0) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        assert server.poll() is None, "sluice serve exited"
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise AssertionError(f"sluice serve did not listen on {port} within {deadline_s} s")


def test_the_getting_started_page_runs_as_written(tmp_path: Path) -> None:
    """Every block of the page, in order, in a fresh directory holding the examples: the
    commands in bash (``pip install`` already done: this venv is the install), a
    ``sluice serve ... &`` started on a free port, the Python blocks against it."""
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    port = _free_port()
    env = {**_no_keys(), "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    servers: list[subprocess.Popen[str]] = []
    ran: list[str] = []
    try:
        for language, block in _blocks(GETTING_STARTED):
            block = block.replace("8000", str(port))
            if language == "python":
                done = subprocess.run(
                    [sys.executable, "-c", block], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
                )
                assert done.returncode == 0, (block, done.stderr)
                assert done.stdout.strip()
                ran.append("python")
                continue
            assert language == "bash"
            for command in block.replace("\\\n", " ").splitlines():
                command = command.split(" # ")[0].strip()
                if not command or command == SUITE_COMMAND:
                    continue
                command = re.sub(r"^pip install -e \S+( && )?", "", command)
                if not command:
                    continue
                if command.endswith("&"):
                    server = subprocess.Popen(
                        shlex.split(command[:-1]),
                        cwd=tmp_path,
                        env=env,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                        text=True,
                    )
                    servers.append(server)
                    _wait_listening(port, server)
                else:
                    done = subprocess.run(
                        ["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
                    )
                    assert done.returncode == 0, (command, done.stdout, done.stderr)
                ran.append(command.split()[0])
    finally:
        for server in servers:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=60)
    assert ran.count("sluice") >= 2
    assert "curl" in ran
    assert "python" in ran
    assert (tmp_path / "results.jsonl").exists()


def test_the_docs_export_columns_are_the_real_header(server: FakeServer, tmp_path: Path) -> None:
    """Issue 34 point 29: the docs' ``export --csv`` column list had drifted from the
    header export writes; the list is read from the page and held to a real export's."""
    import csv

    from clitools import MODEL, questions, run_cli, write_jsonl

    text = (DOCS / "guides" / "structured.md").read_text(encoding="utf-8")
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
