"""``sluice report --html`` and ``--json`` on a job the prompt-cache planner ran: the tokens
it sent uncached, wrote and read, per deployment and group, charted, in headless Chromium."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from browser import needs_chromium, open_page
from cachejobs import document_qa
from clitools import env_for, read_output, run_cli, write_jsonl

from sluice.testing import FakeServer

CLAUDE = "anthropic/claude-sonnet-4-5"


@pytest.fixture
def fake_prices() -> dict[str, tuple[float, float]]:
    return {"claude-sonnet-4-5": (3.0, 15.0)}


def _job(server: FakeServer, folder: Path) -> tuple[Path, list[dict[str, Any]]]:
    lines = [{k: v for k, v in line.items() if k != "model"} for line in document_qa("x", documents=4)]
    source = write_jsonl(folder / "in.jsonl", lines)
    output = folder / "out.jsonl"
    env = env_for(server, ANTHROPIC_BASE_URL=server.anthropic_url, ANTHROPIC_API_KEY="sk-test")
    done = run_cli(server, "run", source, "-o", output, "--model", CLAUDE, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    return output, read_output(output)


def _sluice(*args: str | Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "sluice", *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


@needs_chromium
async def test_the_report_charts_what_the_cache_read_and_wrote(server: FakeServer, tmp_path: Path) -> None:
    output, records = await asyncio.to_thread(_job, server, tmp_path)  # the fake may serve on this loop
    read = sum(r["usage"]["cached_input_tokens"] for r in records)
    written = sum(r["usage"]["cache_write_tokens"] for r in records)
    assert read > 0
    assert written > 0
    figures = json.loads(_sluice("report", output, "--json").stdout)["prompt_cache"]
    assert (figures["read_tokens"], figures["written_tokens"]) == (read, written)
    assert figures["requests"] == len(records)
    target = tmp_path / "report.html"
    done = _sluice("report", output, "--html", target)
    assert done.returncode == 0, done.stderr
    async with open_page(target, wait_for="#cache") as seen:
        assert seen.console_errors == []
        assert seen.page_errors == []
        assert seen.refused == []
        rows = seen.page.locator("#cache tbody tr")
        assert await rows.count() >= 1 + 1 + 4  # the job, its deployment, its four documents' groups
        first = await seen.text("#cache tbody tr")
        assert f"{read:,}" in first
        assert f"{written:,}" in first
        widths = await seen.page.evaluate(
            """() => Array.from(document.querySelectorAll('#cache tbody tr:first-child td.stack span'))
                .map((bar) => bar.getBoundingClientRect().width)"""
        )
        assert len(widths) == 3  # uncached, written, read
        assert widths[2] > widths[1] > 0  # most of the prompts read, some written


def test_a_job_run_with_the_planner_off_reports_no_cache(server: FakeServer, tmp_path: Path) -> None:
    lines = [{k: v for k, v in line.items() if k != "model"} for line in document_qa("x", documents=2)]
    source = write_jsonl(tmp_path / "in.jsonl", lines)
    output = tmp_path / "out.jsonl"
    env = env_for(server, ANTHROPIC_BASE_URL=server.anthropic_url, ANTHROPIC_API_KEY="sk-test")
    args = ("run", source, "-o", output, "--model", CLAUDE, "--prompt-cache", "off")
    assert run_cli(server, *args, env=env, timeout=300).returncode == 0
    assert json.loads(_sluice("report", output, "--json").stdout)["prompt_cache"] is None
    target = tmp_path / "report.html"
    assert _sluice("report", output, "--html", target).returncode == 0
    assert 'id="cache"' not in target.read_text()
