"""Redis: what sharing limits through Redis costs and how well it keeps the limit.

    python bench/redis.py [--rpm 300] [--window 6] [--procs 1,2,4] [--seconds 5]

Needs ``redis-server`` on the PATH (started here on a free loopback port, no persistence)
and ``pip install -e '.[redis]'``. Three measurements:

1. **N processes sharing one limit.** A fake server (its own process) enforces ``--rpm``
   per ``--window`` (with per-slice enforcement, as in ``limits.py``); N worker processes
   (1, 2, 4) split 2 x rpm requests between them, each with an ``Engine`` whose limiter is
   ``RedisLimits(url).limiter_factory``. They start together at an agreed wall-clock
   instant. Ideal time = (requests - 1) x window / rpm; "achieved / ideal" is the ideal
   over the span from the first answer to the last. 429s are the server's own count.
2. **Added latency per reservation.** One process, one deployment with a limit far away:
   ``acquire()`` then ``done()``, one at a time; p50/p99 of ``acquire`` for the shared
   limiter (one round trip: the Lua script) and for ``LocalLimiter`` (no I/O), and of the
   settle round trip of a reservation with an in-flight cap (its lease is released).
3. **Reservations per second one Redis sustains.** ``--procs`` max processes, each with
   eight independent ``RedisLimits`` (eight connections) hammering the same deployment
   (a limit far above what they reach) with acquire + done for ``--seconds``.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).resolve()
# This file is bench/redis.py: with bench/ first on sys.path, ``import redis`` (in
# sluice.redis) would import it instead of redis-py. Put bench/ last.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != SCRIPT.parent]
sys.path.append(str(SCRIPT.parent))

from _common import (  # noqa: E402
    FakeServerProcess,
    machine_line,
    markdown_table,
    run_worker,
    save_results,
    versions_line,
    worker_main,
)

# -- redis-server --------------------------------------------------------------------------


class RedisProcess:
    """A throwaway redis-server on a free loopback port (no persistence)."""

    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise SystemExit("redis-server is not installed (apt-get install -y redis-server)")
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._dir = tempfile.TemporaryDirectory()
        self._proc = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                self._dir.name,
                "--protected-mode",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        self._proc.terminate()
        self._proc.wait(timeout=10)
        self._dir.cleanup()


# -- workers -------------------------------------------------------------------------------


async def measure_share(args: Any) -> dict[str, Any]:
    """One of N processes sharing a limit: run its share, report when answers came."""
    from sluice import Deployment, Engine, Request
    from sluice.redis import RedisLimits

    limits = RedisLimits(args.redis)
    deployment = Deployment("openai/bench", base_url=args.url, api_key="x", rpm=args.rpm, window=args.window)
    requests = [
        Request.from_prompt("openai/bench", f"q {args.tag} {i}", id=f"{args.tag}-{i}", max_tokens=8)
        for i in range(args.n)
    ]
    stamps: list[float] = []
    engine = Engine(deployment, limiter_factory=limits.limiter_factory, on_result=lambda r: stamps.append(time.time()))
    async with engine:
        await asyncio.sleep(max(0.0, args.start_at - time.time()))
        results = await engine.run(requests)
    await limits.close()
    return {
        "first": min(stamps),
        "last": max(stamps),
        "ok": sum(r.ok for r in results),
        "retries": engine.stats.retries,
    }


async def measure_latency(args: Any) -> dict[str, Any]:
    from sluice import Deployment, LocalLimiter
    from sluice.redis import RedisLimits

    n = args.n
    deployment = Deployment("openai/bench", base_url="http://127.0.0.1:9/v1", api_key="x", rpm=1e9, window=60.0)
    capped = Deployment("openai/capped", base_url="http://127.0.0.1:9/v1", api_key="x", rpm=1e9, max_in_flight=1000)
    limits = RedisLimits(args.redis)
    shared, shared_capped = limits.limiter_factory(deployment), limits.limiter_factory(capped)
    local = LocalLimiter(requests=1e9, window=60.0)

    async def timed(limiter: Any, settle: bool) -> list[float]:
        out = []
        for _ in range(n):
            started = time.perf_counter()
            grant = await limiter.acquire(1)
            if settle:
                grant.done()
                await limits.connection.flush()
            else:
                out.append(time.perf_counter() - started)
                grant.done()
                continue
            out.append(time.perf_counter() - started)
        return out

    await timed(shared, False)  # warm up: scripts loaded, connections open
    result = {
        "redis_acquire": await timed(shared, False),
        "local_acquire": await timed(local, False),
        "redis_acquire_settle": await timed(shared_capped, True),
    }
    await limits.close()
    return {k: sorted(v) for k, v in result.items()}


async def measure_hammer(args: Any) -> dict[str, Any]:
    from sluice import Deployment
    from sluice.redis import RedisLimits

    deployment = Deployment("openai/hammer", base_url="http://127.0.0.1:9/v1", api_key="x", rpm=1e9, window=60.0)
    clients = [RedisLimits(args.redis) for _ in range(8)]
    counts = [0] * len(clients)

    async def hammer(i: int, until: float) -> None:
        limiter = clients[i].limiter_factory(deployment)
        while time.time() < until:
            (await limiter.acquire(1)).done()
            counts[i] += 1

    await asyncio.sleep(max(0.0, args.start_at - time.time()))
    await asyncio.gather(*(hammer(i, args.start_at + args.seconds) for i in range(len(clients))))
    for client in clients:
        await client.close()
    return {"grants": sum(counts)}


MEASURES = {"share": measure_share, "latency": measure_latency, "hammer": measure_hammer}


def worker(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--client", required=True, choices=sorted(MEASURES))
    parser.add_argument("--redis", required=True)
    parser.add_argument("--url", default="")
    parser.add_argument("--tag", default="a")
    parser.add_argument("--n", type=int, default=0)
    parser.add_argument("--rpm", type=float, default=0)
    parser.add_argument("--window", type=float, default=60.0)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--start-at", type=float, default=0.0)
    args = parser.parse_args(argv)
    return worker_main(MEASURES[args.client], args)


# -- the driver ----------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))]


def run_parallel(arg_lists: list[list[str]], timeout: float) -> list[dict[str, Any] | None]:
    """Run several workers at once (threads only wait on their processes)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(arg_lists)) as pool:
        outcomes = list(pool.map(lambda a: run_worker(SCRIPT, a, timeout=timeout), arg_lists))
    for outcome in outcomes:
        if outcome.result is None:
            print(f"  worker failed: {outcome.error}\n{outcome.stderr_tail}", file=sys.stderr)
    return [o.result for o in outcomes]


def share_rows(redis: RedisProcess, args: argparse.Namespace) -> list[list[object]]:
    rows: list[list[object]] = []
    total = int(2 * args.rpm)
    ideal = (total - 1) * args.window / args.rpm
    for procs in args.procs:
        redis_flush(redis)
        fake_args = ["--rpm", str(args.rpm), "--window", str(args.window)]
        with FakeServerProcess(fake_args) as server:
            start_at = time.time() + 4.0  # every worker imported and connected by then
            lists = [
                [
                    "--client",
                    "share",
                    "--redis",
                    redis.url,
                    "--url",
                    server.openai_url,
                    "--tag",
                    f"p{i}",
                    "--n",
                    str(total // procs + (1 if i < total % procs else 0)),
                    "--rpm",
                    str(args.rpm),
                    "--window",
                    str(args.window),
                    "--start-at",
                    repr(start_at),
                ]
                for i in range(procs)
            ]
            results = run_parallel(lists, timeout=ideal * 4 + 60)
            stats = server.stats()
        done = [r for r in results if r is not None]
        span = max(r["last"] for r in done) - min(r["first"] for r in done) if done else float("nan")
        rows.append(
            [
                procs,
                total,
                sum(r["ok"] for r in done),
                f"{ideal:.2f}",
                f"{span:.2f}",
                f"{ideal / span:.1%}",
                stats.get("rate_limited"),
            ]
        )
    return rows


def redis_flush(redis: RedisProcess) -> None:
    with socket.create_connection(("127.0.0.1", redis.port)) as sock:
        sock.sendall(b"FLUSHALL\r\n")
        sock.recv(64)


def main() -> int:
    if "--worker" in sys.argv:
        return worker(sys.argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rpm", type=float, default=300.0)
    parser.add_argument("--window", type=float, default=6.0)
    parser.add_argument("--procs", type=lambda s: [int(p) for p in s.split(",")], default=[1, 2, 4])
    parser.add_argument("--latency-n", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    print(machine_line())
    print(versions_line())
    redis = RedisProcess()
    payload: dict[str, Any] = {}
    try:
        print(f"\n### N processes sharing {args.rpm:g} requests per {args.window:g} s (2 x rpm requests)\n")
        rows = share_rows(redis, args)
        payload["share"] = rows
        print(
            markdown_table(
                ["processes", "requests", "answered", "ideal s", "took s", "achieved / ideal", "429s"],
                rows,
                right=[0, 1, 2, 3, 4, 5, 6],
            )
        )

        print("\n### Added latency per reservation (one process, sequential)\n")
        redis_flush(redis)
        (latency,) = run_parallel([["--client", "latency", "--redis", redis.url, "--n", str(args.latency_n)]], 300)
        lat_rows = []
        if latency is not None:
            for key, label in (
                ("local_acquire", "LocalLimiter.acquire"),
                ("redis_acquire", "RedisLimiter.acquire (1 round trip)"),
                ("redis_acquire_settle", "RedisLimiter.acquire + done, in-flight cap (2 round trips)"),
            ):
                values = latency[key]
                lat_rows.append(
                    [
                        label,
                        f"{percentile(values, 0.5) * 1e6:.0f}",
                        f"{percentile(values, 0.99) * 1e6:.0f}",
                        f"{statistics.mean(values) * 1e6:.0f}",
                    ]
                )
        payload["latency"] = lat_rows
        print(markdown_table(["operation", "p50 µs", "p99 µs", "mean µs"], lat_rows, right=[1, 2, 3]))

        print(f"\n### Reservations per second one Redis sustains ({args.seconds:g} s)\n")
        hammer_rows = []
        for procs in sorted({1, max(args.procs)}):
            redis_flush(redis)
            start_at = time.time() + 4.0
            results = run_parallel(
                [
                    [
                        "--client",
                        "hammer",
                        "--redis",
                        redis.url,
                        "--seconds",
                        str(args.seconds),
                        "--start-at",
                        repr(start_at),
                    ]
                    for _ in range(procs)
                ],
                timeout=args.seconds + 60,
            )
            grants = sum(r["grants"] for r in results if r is not None)
            hammer_rows.append([procs, procs * 8, grants, f"{grants / args.seconds:,.0f}"])
        payload["hammer"] = hammer_rows
        print(markdown_table(["processes", "connections", "grants", "grants/s"], hammer_rows, right=[0, 1, 2, 3]))
    finally:
        redis.stop()
    path = save_results("redis", payload)
    print(f"\nraw figures: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
