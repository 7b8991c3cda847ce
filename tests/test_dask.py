"""sluice inside Dask (issue 36): ``sluice.dask.complete(frame, ...)`` on a local
distributed cluster of worker processes (started once for the module), a real
redis-server and the fake provider with its own limits. The checks are test_ray.py's
(``pipelinetools``): only how the pipeline runs differs."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pipelinetools as checks
import pytest
from pipelinetools import KEY, KEY_ENV

dd = pytest.importorskip("dask.dataframe")
distributed = pytest.importorskip("distributed")
import dask  # noqa: E402
import pandas as pd  # noqa: E402

import sluice.dask  # noqa: E402
from sluice import ConfigError  # noqa: E402

pytestmark = [pytest.mark.timeout(600), pytest.mark.xdist_group("dask")]  # one cluster, in one test worker


@pytest.fixture(scope="module", autouse=True)
def local_cluster() -> Iterator[Any]:
    """Three worker processes (each restarted by its nanny if it dies), with the key in
    their environment, for the module."""
    os.environ[KEY_ENV] = KEY
    with (
        distributed.LocalCluster(
            n_workers=3, threads_per_worker=2, processes=True, dashboard_address=":0", silence_logs=40
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        yield client


redis_url = checks.redis_url  # the fixture: one redis-server for the module


def run(rows: list[dict[str, Any]], args: dict[str, Any], *, workers: int, batch_size: int) -> list[dict[str, Any]]:
    """The pipeline: a Dask frame of the rows, a partition per ``batch_size`` rows."""
    with dask.config.set({"dataframe.convert-string": False}):  # lists stay lists (README)
        frame = dd.from_pandas(pd.DataFrame(rows), chunksize=batch_size)
    answered = sluice.dask.complete(frame, **args).compute()
    out: list[dict[str, Any]] = answered.to_dict("records")
    for row in out:
        for name, value in row.items():
            if isinstance(value, float) and value != value:
                row[name] = None  # pandas' missing value, as Ray gives it
    return sorted(out, key=lambda row: row["i"])


def test_300_rows_on_one_shared_limit_then_a_rerun_sends_nothing(redis_url: str) -> None:
    checks.check_300_rows_then_a_rerun(run, redis_url, "dask-300")


def test_a_budget_of_half_the_bill_holds_across_workers(redis_url: str) -> None:
    checks.check_a_budget_of_half_the_bill(run, redis_url, "dask-budget")


def test_a_killed_worker_loses_nothing_and_rebills_at_most_its_rows_in_flight(redis_url: str) -> None:
    checks.check_a_killed_worker(run, redis_url, "dask-kill")


def test_bad_rows_fail_alone(redis_url: str) -> None:
    checks.check_bad_rows_fail_alone(run, redis_url, "dask-bad")


def test_a_bad_argument_is_said_at_once_in_the_callers_process(redis_url: str) -> None:
    frame = dd.from_pandas(pd.DataFrame({"prompt": ["a"]}), npartitions=1)
    with pytest.raises(ConfigError, match="budget_usd="):
        sluice.dask.complete(frame, model="openai/gpt-test", redis=redis_url, job="j", budget_usd="5")
    with pytest.raises(ConfigError, match="job="):
        sluice.dask.complete(frame, model="openai/gpt-test", redis=redis_url, job="two words")
    texts = dd.from_pandas(pd.DataFrame({"messages": [[{"role": "user", "content": "a"}]]}), npartitions=1)
    with pytest.raises(ConfigError, match="convert-string"):
        sluice.dask.complete(texts, model="openai/gpt-test", redis=redis_url, job="j")
