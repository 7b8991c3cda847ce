"""sluice inside Spark, by hand: ``python examples/spark_rows.py`` (needs ``pip install
pyspark pandas pyarrow 'llm-sluice[redis]'``, a JVM and ``redis-server`` on the PATH).

A local Spark (``local[2]``: two Python workers) answers 150 rows through
``mapInPandas`` on the seam ``sluice.pipelines``, against the fake provider on loopback
(100 requests per 10 s) and a redis-server of its own: both workers share one limit, so
the fake says no 429. Then the same pipeline runs again and sends nothing: every row is
answered from the job's store. Not part of the test suite (pyspark is a 450 MB download).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time

from sluice.testing import FakeServer

KEY = "sk-spark-example"
PRICE = (1.0, 2.0)  # dollars per million input and output tokens, at the fake and in sluice


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def main() -> int:
    if shutil.which("redis-server") is None or shutil.which("java") is None:
        print("this example needs redis-server and java on the PATH", file=sys.stderr)
        return 2
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

    from sluice.pipelines import answer_batch, row_job, shared_worker

    os.environ["SPARK_EXAMPLE_KEY"] = KEY  # the workers read the key from their environment
    port = free_port()
    redis = subprocess.Popen(
        ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL
    )
    try:
        time.sleep(0.5)
        with FakeServer(api_key=KEY, prices={"*": PRICE}, rpm=100, window=10).running_in_thread() as fake:
            spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
            import pandas as pd

            df = spark.createDataFrame(pd.DataFrame({"prompt": [f"question {i}" for i in range(150)]}))
            args = {
                "model": "openai/gpt-test",
                "redis": f"redis://127.0.0.1:{port}/0",
                "job": "spark-example",
                "base_url": fake.url,
                "api_key_env": "SPARK_EXAMPLE_KEY",
                "price": PRICE,
                "rpm": 100,
                "window": 10,
            }
            job = row_job("spark", args)  # checked here, on the driver

            def answer(frames):  # type: ignore[no-untyped-def]
                worker = shared_worker(job)  # one engine per Python worker process
                for frame in frames:
                    yield answer_batch(worker, frame)

            # a copy: in Spark 4, df.schema.add(...) changes the frame's own schema
            schema = (
                StructType(list(df.schema.fields))
                .add("ok", "boolean")
                .add("text", "string")
                .add("error_type", "string")
                .add("error", "string")
                .add("cost_usd", "double")
                .add("attempts", "long")
                .add("deployment", "string")
                .add("cached", "boolean")
            )
            started = time.monotonic()
            first = df.mapInPandas(answer, schema=schema).toPandas()
            took = time.monotonic() - started
            sent = fake.stats.received
            print(f"{len(first)} rows, {int(first.ok.sum())} answered, {fake.stats.rate_limited} 429s, {took:.1f} s")
            again = df.mapInPandas(answer, schema=schema).toPandas()
            print(f"rerun: {int(again.ok.sum())} answered, {fake.stats.received - sent} sent again")
            spark.stop()
            return 0 if first.ok.all() and fake.stats.rate_limited == 0 and fake.stats.received == sent else 1
    finally:
        redis.terminate()
        redis.wait(timeout=10)


if __name__ == "__main__":
    sys.exit(main())
