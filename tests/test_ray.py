"""sluice inside Ray Data (issue 36): ``map_batches(sluice.ray.Completions, concurrency=N)``
on a Ray started here (``ray.init(num_cpus=2)``, once for the module), a real
redis-server and the fake provider with its own limits. The checks are test_dask.py's
(``pipelinetools``): only how the pipeline runs differs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pipelinetools as checks
import pytest
from pipelinetools import KEY, KEY_ENV

ray = pytest.importorskip("ray")

import sluice.ray  # noqa: E402
from sluice import ConfigError  # noqa: E402

pytestmark = [
    pytest.mark.timeout(600),
    pytest.mark.xdist_group("ray"),  # one local Ray for the module, in one test worker
    # Ray's own deprecations of its own settings, warned as it starts: not sluice's
    pytest.mark.filterwarnings(r"ignore::DeprecationWarning:ray\..*"),
]


@pytest.fixture(scope="module", autouse=True)
def local_ray() -> Iterator[None]:
    """One local Ray for the module (its start-up is the slow part), quiet."""
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        logging_level="ERROR",
        runtime_env={"env_vars": {KEY_ENV: KEY}},  # as a user gives the actors their key
    )
    ray.data.DataContext.get_current().enable_progress_bars = False
    try:
        yield
    finally:
        ray.shutdown()


redis_url = checks.redis_url  # the fixture: one redis-server for the module


def run(rows: list[dict[str, Any]], args: dict[str, Any], *, workers: int, batch_size: int) -> list[dict[str, Any]]:
    """The pipeline: rows through an actor pool of sluice.ray.Completions, every row back."""
    answered = ray.data.from_items(rows).map_batches(
        sluice.ray.Completions,
        fn_constructor_kwargs=args,
        concurrency=workers,
        num_cpus=0.25,  # actors that wait on the network leave the CPUs to Ray's own tasks
        batch_size=batch_size,
    )
    return sorted(answered.take_all(), key=lambda row: row["i"])


def test_300_rows_on_one_shared_limit_then_a_rerun_sends_nothing(redis_url: str) -> None:
    checks.check_300_rows_then_a_rerun(run, redis_url, "ray-300")


def test_a_budget_of_half_the_bill_holds_across_actors(redis_url: str) -> None:
    checks.check_a_budget_of_half_the_bill(run, redis_url, "ray-budget")


def test_a_killed_actor_loses_nothing_and_rebills_at_most_its_rows_in_flight(redis_url: str) -> None:
    checks.check_a_killed_worker(run, redis_url, "ray-kill")


def test_bad_rows_fail_alone(redis_url: str) -> None:
    checks.check_bad_rows_fail_alone(run, redis_url, "ray-bad")


def test_a_bad_argument_is_said_at_once_naming_it(redis_url: str) -> None:
    with pytest.raises(ConfigError, match="rpm="):
        sluice.ray.Completions(model="openai/gpt-test", redis=redis_url, job="j", rpm=-1)
    with pytest.raises(ConfigError, match="redis="):
        sluice.ray.Completions(model="openai/gpt-test", redis="http://queue:6379", job="j")
    with pytest.raises(ConfigError, match="unknown argument rpmm="):
        sluice.ray.Completions(model="openai/gpt-test", redis=redis_url, job="j", rpmm=5)
