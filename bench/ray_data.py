"""Ray Data's own HTTP stage against sluice inside Ray, on the same job and the same limit.

One local Ray (``ray.init(num_cpus=2)``), a real redis-server, the fake provider taking
100 requests per 10 s and billing $1/$2 per million tokens. The job: 300 rows, three
actors. Ray's stage (``ray.data.llm.HttpRequestProcessorConfig``, Ray 2.60) is given the
provider's rate as its ``qps`` (per actor: it knows no other), and then a third of it; it
has no budget. sluice is given the limit once (``rpm=100, window=10``, shared on Redis)
and a budget of half the job's bill. Prints a table (bench/README.md has one).

    python bench/ray_data.py [--rows 300]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# bench/redis.py (a benchmark) would shadow redis-py; the tests' redis_server helper is wanted
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
sys.path.insert(0, str(HERE.parent / "tests"))

import ray  # noqa: E402
import ray.data  # noqa: E402
from ray.data.llm import HttpRequestProcessorConfig, build_processor  # noqa: E402
from redis_server import RedisServer  # noqa: E402

import sluice.ray  # noqa: E402
from sluice.testing import FakeServer  # noqa: E402

KEY = "sk-bench-ray"
PRICE = (1.0, 2.0)


def _row_bill(fake: FakeServer) -> float:
    return sum(entry.cost_usd for entry in fake.ledger)


def ray_stage(fake: FakeServer, rows: int, qps: int) -> dict[str, Any]:
    config = HttpRequestProcessorConfig(
        url=f"{fake.url}/chat/completions",
        headers={"Authorization": f"Bearer {KEY}"},
        concurrency=3,
        qps=qps,
        max_retries=3,
        batch_size=50,
    )
    processor = build_processor(
        config,
        preprocess=lambda row: {
            "payload": {
                "model": "gpt-test",
                "messages": [{"role": "user", "content": row["prompt"]}],
                "max_tokens": 16,
            }
        },
        postprocess=lambda row: {"ok": "choices" in (row.get("http_response") or {})},
    )
    started = time.monotonic()
    try:
        out = processor(ray.data.from_items(_prompts(rows))).take_all()
        answered, error = sum(bool(r["ok"]) for r in out), ""
    except Exception as exc:  # its retries exhausted: the stage raises, the job is lost
        answered, error = 0, type(exc).__name__
    return {"answered": answered, "seconds": time.monotonic() - started, "error": error}


def sluice_stage(fake: FakeServer, redis_url: str, rows: int, budget: float | None, job: str) -> dict[str, Any]:
    args = {
        "model": "openai/gpt-test",
        "redis": redis_url,
        "job": job,
        "rpm": 100,
        "window": 10,
        "base_url": fake.url,
        "api_key_env": "BENCH_KEY",
        "price": PRICE,
        "max_tokens": 16,
        "budget_usd": budget,
    }
    started = time.monotonic()
    out = (
        ray.data.from_items(_prompts(rows))
        .map_batches(sluice.ray.Completions, fn_constructor_kwargs=args, concurrency=3, num_cpus=0.25, batch_size=50)
        .take_all()
    )
    return {"answered": sum(bool(r["ok"]) for r in out), "seconds": time.monotonic() - started, "error": ""}


def _prompts(n: int) -> list[dict[str, Any]]:
    return [{"prompt": f"question number {i}"} for i in range(n)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=300)
    rows = parser.parse_args().rows
    os.environ["BENCH_KEY"] = KEY
    table: list[tuple[str, dict[str, Any], int, float, str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        redis_server = RedisServer(Path(tmp))
        redis_server.start()
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
        ray.data.DataContext.get_current().enable_progress_bars = False
        try:
            with FakeServer(rpm=100, window=10, api_key=KEY, prices={"*": PRICE}).running_in_thread() as fake:
                runs = [
                    ("Ray HTTP stage, qps=10 a actor", lambda: ray_stage(fake, rows, 10), "none"),
                    ("Ray HTTP stage, qps=3 a actor", lambda: ray_stage(fake, rows, 3), "none"),
                    (
                        "sluice.ray, rpm=100/10 s shared",
                        lambda: sluice_stage(fake, redis_server.url, rows, None, "b1"),
                        "-",
                    ),
                ]
                full_bill = 0.0
                for name, go, budget in runs:
                    fake.reset_stats()
                    fake.ledger.clear()
                    time.sleep(10)  # the provider's window empties between runs
                    result = go()
                    full_bill = full_bill or _row_bill(fake)
                    table.append((name, result, fake.stats.rate_limited, _row_bill(fake), budget))
                fake.reset_stats()
                fake.ledger.clear()
                time.sleep(10)
                half = full_bill / 2
                result = sluice_stage(fake, redis_server.url, rows, half, "b2")
                held = "held" if _row_bill(fake) <= half else "OVER"
                table.append(
                    (f"sluice.ray, budget ${half:.4f}", result, fake.stats.rate_limited, _row_bill(fake), held)
                )
        finally:
            ray.shutdown()
            redis_server.kill()
    print(f"{rows} rows, 3 actors, a provider taking 100 requests per 10 s (ideal: {rows / 10:.0f} s)\n")
    print(f"| {'run':34} | answered | 429s | seconds | billed   | budget | error |")
    print(f"|{'-' * 36}|----------|------|---------|----------|--------|-------|")
    for name, result, limited, bill, budget in table:
        print(
            f"| {name:34} | {result['answered']:8} | {limited:4} | {result['seconds']:7.1f} | "
            f"${bill:.5f} | {budget:6} | {result['error'] or '-'} |"
        )


if __name__ == "__main__":
    main()
