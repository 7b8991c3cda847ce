"""The prompt-cache planner on ``sluice run --tier batch`` and ``--tier auto``: the command
as a subprocess, the fake's Message Batches caching as Anthropic documents (a batch's
lines read the entries that earlier lines of it wrote)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from cachejobs import document_qa
from clitools import env_for, read_output, run_cli, write_jsonl

from sluice.testing import FakeServer

CLAUDE = "anthropic/claude-sonnet-4-5"
BATCH = ("--tier", "batch", "--poll-every", "0.2")


@pytest.fixture
def fake_prices() -> dict[str, tuple[float, float]]:
    return {"claude-sonnet-4-5": (3.0, 15.0)}


def _lines(**shape: Any) -> list[dict[str, Any]]:
    return [{k: v for k, v in line.items() if k != "model"} for line in document_qa("claude-sonnet-4-5", **shape)]


def _run(server: FakeServer, source: Path, output: Path, *extra: str) -> str:
    env = env_for(server, ANTHROPIC_BASE_URL=server.anthropic_url, ANTHROPIC_API_KEY="sk-test")
    done = run_cli(server, "run", source, "-o", output, "--model", CLAUDE, *extra, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("tier", [BATCH, ("--tier", "auto", "--poll-every", "0.2", "--deadline", "1h")])
def test_a_batch_tier_job_bills_a_third_of_itself_uncached(
    server: FakeServer, tmp_path: Path, tier: tuple[str, ...]
) -> None:
    """The document-QA job through provider batches: each group's first line writes its
    prefix for an hour (as the docs advise for batches), the rest read it; the records'
    costs are what the fake billed, and the summary counts the batch lines' cache."""
    source = write_jsonl(tmp_path / "in.jsonl", _lines())
    _run(server, source, tmp_path / "off.jsonl", *tier, "--prompt-cache", "off")
    uncached = server.total_billed_usd
    server.prompt_cache.reset()  # nothing of the first run is read
    summary = _run(server, source, tmp_path / "on.jsonl", *tier)
    cached = server.total_billed_usd - uncached
    assert cached <= 0.35 * uncached, (cached, uncached)
    records = read_output(tmp_path / "on.jsonl")
    assert {r["tier"] for r in records} == {"batch"}
    assert sum(r["cost_usd"] for r in records) == pytest.approx(cached)  # what the fake billed
    assert sum(r["usage"].get("cache_write_1h_tokens", 0) for r in records) > 0
    read = int(re.search(r"prompt cache\s+([\d,]+) tokens read", summary).group(1).replace(",", ""))  # type: ignore[union-attr]
    assert read == sum(r["usage"]["cached_input_tokens"] for r in records) > 0
    assert "0 duplicate writes" in summary
    if tier == BATCH:  # what `sluice estimate --tier batch` foresaw: the plan on the batch, hour-long writes
        env = env_for(server, ANTHROPIC_BASE_URL=server.anthropic_url, ANTHROPIC_API_KEY="sk-test")
        estimate = run_cli(server, "estimate", source, "--model", CLAUDE, "--tier", "batch", "--json", env=env)
        assert estimate.returncode == 0, estimate.stderr
        figures = json.loads(estimate.stdout)
        assert figures["tier"] == "batch"
        assert figures["cost_usd"] == pytest.approx(cached, rel=0.25)
        assert figures["cost_usd_without_cache"] == pytest.approx(uncached, rel=0.25)


def test_each_group_goes_in_one_provider_batch(server: FakeServer, tmp_path: Path) -> None:
    """Batches of 16 lines over groups of 6 and lines that share nothing: the plan fills
    each batch with whole groups (a group split over two batches answered side by side
    would write twice), the lone lines filling the gaps."""
    grouped = _lines(documents=10, questions=6)
    lone = [{"messages": [{"role": "user", "content": f"hello {i}"}], "max_tokens": 16} for i in range(20)]
    mixed = [line for pair in zip(grouped[:20], lone, strict=True) for line in pair] + grouped[20:]
    source = write_jsonl(tmp_path / "in.jsonl", mixed)
    _run(server, source, tmp_path / "out.jsonl", *BATCH, "--batch-size", "16")
    batch_of: dict[str, set[str]] = {}
    for batch in server.batches.batches.values():
        for line in batch.lines:
            found = re.search(r"Document \d+", json.dumps(line.body))
            if found:
                batch_of.setdefault(found.group(0), set()).add(batch.id)
    assert len(batch_of) == 10
    assert all(len(batches) == 1 for batches in batch_of.values()), batch_of
    assert len(read_output(tmp_path / "out.jsonl")) == 80


@pytest.mark.parametrize(
    ("sizes", "chunk", "expected"),
    [
        ([6, 6, 6, 1, 1, 1, 1, 1], 16, [6, 6, 1, 1, 1, 1, 6, 1]),  # two groups and lone lines fill a run
        ([3, 5, 8, 2], 8, [8, 5, 3, 2]),  # largest first, each into the first run with room
        ([20, 1], 8, [8, 8, 4, 1]),  # larger than a run: runs of its own, the rest packed
        ([5, 5, 5], 6, [5, 5, 5]),  # nothing fits beside another: a run each
    ],
)
def test_packing_keeps_groups_inside_runs_of_a_batch(sizes: list[int], chunk: int, expected: list[int]) -> None:
    from sluice.batch._cache_plan import packed

    units, start = [], 0
    for size in sizes:
        units.append(list(range(start, start + size)))
        start += size
    out = list(packed(units, chunk))
    assert [len(unit) for unit in out] == expected
    assert sorted(p for unit in out for p in unit) == list(range(start))
