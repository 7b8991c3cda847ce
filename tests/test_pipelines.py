"""The seam under sluice.ray and sluice.dask (issue 36), without either engine: a worker's
engine on a real redis-server answering batches of every format, the directory store,
embeddings, what an answer costs in Redis, and ``sluice report --redis --job``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import redis
from clitools import run_cli
from pipelinetools import fake_provider, job_args, prompts
from redis_server import RedisServer

from sluice.pipelines import RowWorker, add_columns, answer_batch, batch_rows, read_progress, row_job

pytestmark = pytest.mark.timeout(180)


def _worker(args: dict[str, object]) -> RowWorker:
    return RowWorker(row_job("test", args, embeddings=bool(args.pop("embeddings", False))))


def test_import_sluice_imports_no_engine() -> None:
    code = (
        "import sys, sluice; sluice.Engine; sluice.run; "
        "print(sorted(m for m in ('ray', 'dask', 'pandas', 'pyarrow', 'sluice.pipelines') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("kind", ["pandas", "arrow", "columns"])
def test_every_batch_format_comes_back_in_its_own_type_with_the_answer_columns(kind: str) -> None:
    rows = [{"messages": [{"role": "user", "content": f"q{i}"}], "n": i, "max": 5.0} for i in range(3)]
    frame = pd.DataFrame(rows)
    batch = {"pandas": frame, "arrow": pa.Table.from_pandas(frame), "columns": {k: frame[k].to_numpy() for k in frame}}[
        kind
    ]
    read = batch_rows(batch)
    assert read[1] == {"messages": [{"role": "user", "content": "q1"}], "n": 1, "max": 5}  # plain, whole floats ints
    out = add_columns(batch, {"ok": [True, False, True], "cost_usd": [0.1, None, 0.2], "text": ["a", None, "c"]})
    assert type(out) is type(batch)
    again = batch_rows(out)
    assert [r["ok"] for r in again] == [True, False, True]
    assert [r["text"] for r in again] == ["a", None, "c"]
    assert again[1]["cost_usd"] is None
    assert again[2]["n"] == 2


def test_a_directory_store_resumes_and_redis_keeps_only_the_counts(redis_server: RedisServer, tmp_path: Path) -> None:
    with fake_provider() as fake:
        args = job_args(fake, redis_server.url, "dir-job", store=str(tmp_path / "answers"))
        worker = _worker(dict(args))
        try:
            first = answer_batch(worker, pd.DataFrame(prompts(20)))
        finally:
            worker.close()
        assert first["ok"].all()
        assert len(list((tmp_path / "answers" / "dir-job").rglob("*.json"))) == 20
        received = fake.stats.received
        worker = _worker(dict(args))
        try:
            again = answer_batch(worker, pd.DataFrame(prompts(20)))
        finally:
            worker.close()
        assert fake.stats.received == received
        assert again["cached"].all()
    client = redis.Redis.from_url(redis_server.url)
    assert not client.exists("sluice:rows:{dir-job}:results")
    assert read_progress(redis_server.url, "dir-job")["answered"] == 20


def test_an_answer_costs_a_few_hundred_bytes_in_redis(redis_server: RedisServer) -> None:
    """What the README states per row: the answers hash's memory over its rows."""
    with fake_provider(output_tokens=16) as fake:
        worker = _worker(job_args(fake, redis_server.url, "memory-job"))
        try:
            answer_batch(worker, pd.DataFrame(prompts(500)))
        finally:
            worker.close()
    client = redis.Redis.from_url(redis_server.url)
    used = client.memory_usage("sluice:rows:{memory-job}:results", samples=0)
    per_row = used / 500
    print(f"{per_row:.0f} bytes per answered row")
    assert 150 <= per_row <= 600, (per_row, client.hlen("sluice:rows:{memory-job}:results"))


def test_embeddings_rows_get_vectors_and_a_rerun_sends_none(redis_server: RedisServer) -> None:
    with fake_provider() as fake:
        args = job_args(fake, redis_server.url, "embed-job", model="openai/text-embedding-3-small", embeddings=True)
        frame = pd.DataFrame({"text": ["one", "two", None, "three"]})
        worker = _worker(dict(args))
        try:
            out = answer_batch(worker, frame)
        finally:
            worker.close()
        assert list(out["ok"]) == [True, True, False, True]
        assert out["error_type"][2] == "invalid_input"
        assert isinstance(out["vector"][0], np.ndarray)
        assert out["vector"][0].dtype == np.float32
        received = fake.stats.received
        worker = _worker(dict(args))
        try:
            again = answer_batch(worker, frame)
        finally:
            worker.close()
        assert fake.stats.received == received
        assert list(again["cached"]) == [True, True, False, True]
        assert np.array_equal(again["vector"][1], out["vector"][1])


def test_sluice_report_shows_a_pipeline_job_from_its_redis(redis_server: RedisServer, tmp_path: Path) -> None:
    with fake_provider() as fake:
        worker = _worker(job_args(fake, redis_server.url, "report-job", budget_usd=1.0))
        try:
            rows = [*prompts(12), {"i": 12, "prompt": 5}]
            answer_batch(worker, pd.DataFrame(rows))
            table = run_cli(fake, "report", "--redis", redis_server.url, "--job", "report-job")
        finally:
            worker.close()
        assert table.returncode == 0, table.stderr
        assert "rows answered" in table.stdout
        assert "12" in table.stdout
        assert "invalid_input" in table.stdout
        assert "budget" in table.stdout
        html = tmp_path / "report.html"
        plotted = run_cli(fake, "report", "--redis", redis_server.url, "--job", "report-job", "--html", html, "--json")
        assert plotted.returncode == 0, plotted.stderr
        figures = json.loads(plotted.stdout)
        assert figures["records"]["succeeded"] == 12
        assert html.read_bytes().startswith(b"<!DOCTYPE html>")
        missing = run_cli(fake, "report", "--redis", redis_server.url, "--job", "no-such-job")
        assert missing.returncode == 2
        assert "no pipeline job 'no-such-job'" in missing.stderr
        alone = run_cli(fake, "report", "--job", "report-job")
        assert alone.returncode == 2
        assert "--redis and --job go together" in alone.stderr


def test_a_schema_gives_each_row_its_parsed_answer(redis_server: RedisServer) -> None:
    schema = {
        "type": "object",
        "properties": {"label": {"type": "string"}, "score": {"type": "integer"}},
        "required": ["label", "score"],
        "additionalProperties": False,
    }
    with fake_provider() as fake:
        worker = _worker(job_args(fake, redis_server.url, "schema-job", schema=schema))
        try:
            out = answer_batch(worker, pd.DataFrame(prompts(3)))
        finally:
            worker.close()
    assert out["ok"].all()
    assert all(set(parsed) == {"label", "score"} for parsed in out["parsed"])
    assert all(isinstance(parsed["score"], int) for parsed in out["parsed"])
