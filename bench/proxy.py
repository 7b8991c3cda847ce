"""What ``sluice serve`` adds: latency (p50/p99) and the proxy's CPU per request.

The fake server (zero latency, no limits) runs in its own process; ``sluice serve`` runs in
another, in front of it, as a user would run it (``--config``, loopback, no client keys);
the client is the official openai SDK in this process. The same requests (distinct
prompts, so none is answered from sluice's state) go to the fake directly and through the
proxy:

* **latency**: one request at a time (``--sequential`` of them after ``--warmup``), p50
  and p99 of the SDK call's wall time; the proxy's added latency is the difference;
* **throughput and CPU**: ``--n`` requests at ``--concurrency``; the proxy's CPU per
  request is its process's user+system time (``/proc/PID/stat``) over the phase, divided
  by the requests (Linux only; elsewhere the column says "n/a").

Run: ``python bench/proxy.py`` (~1 min on 2 cores). Prints a markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import FakeServerProcess, ServeProcess, markdown_table, save_results, versions_line


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` so far (Linux ``/proc``), else None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks  # utime, stime: fields 14 and 15 of stat


def serve_in_front_of(upstream: str, state: Path) -> ServeProcess:
    """``sluice serve`` in front of ``upstream``: no limits of its own, a price, a deep queue."""
    return ServeProcess(
        f'[serve]\nmax_queue = 100000\n\n[[deployment]]\nmodel = "openai/bench"\nbase_url = "{upstream}"\n'
        'api_key_env = "BENCH_UPSTREAM_KEY"\nprice = { input_per_mtok = 0.15, output_per_mtok = 0.60 }\n',
        state,
    )


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


async def _measure(url: str, tag: str, args: argparse.Namespace, pid: int | None) -> dict[str, Any]:
    import openai

    client = openai.AsyncOpenAI(base_url=url, api_key="sk-bench", max_retries=0)
    counter = iter(range(10**9))

    async def call() -> float:
        began = time.perf_counter()
        await client.chat.completions.create(
            model="bench", messages=[{"role": "user", "content": f"{tag} question {next(counter)}"}], max_tokens=16
        )
        return time.perf_counter() - began

    for _ in range(args.warmup):
        await call()
    latencies = [await call() for _ in range(args.sequential)]
    gate = asyncio.Semaphore(args.concurrency)

    async def bounded() -> float:
        async with gate:
            return await call()

    cpu_before = _cpu_seconds(pid) if pid is not None else None
    began = time.perf_counter()
    await asyncio.gather(*(bounded() for _ in range(args.n)))
    wall = time.perf_counter() - began
    cpu_after = _cpu_seconds(pid) if pid is not None else None
    await client.close()
    cpu = None if cpu_before is None or cpu_after is None else (cpu_after - cpu_before) / args.n
    return {
        "p50_ms": _percentile(latencies, 50) * 1000,
        "p99_ms": _percentile(latencies, 99) * 1000,
        "rps": args.n / wall,
        "proxy_cpu_ms_per_request": None if cpu is None else cpu * 1000,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--sequential", type=int, default=500, help="requests one at a time, for latency")
    parser.add_argument("--n", type=int, default=2000, help="requests at --concurrency, for CPU and req/s")
    parser.add_argument("--concurrency", type=int, default=50)
    args = parser.parse_args()
    with FakeServerProcess([]) as fake, tempfile.TemporaryDirectory() as tmp:
        proxy = serve_in_front_of(fake.openai_url, Path(tmp))
        try:
            direct = asyncio.run(_measure(fake.openai_url, "direct", args, None))
            through = asyncio.run(_measure(proxy.url, "proxy", args, proxy.process.pid))
        finally:
            proxy.stop()
    rows = []
    for name, record in (("openai SDK -> fake", direct), ("openai SDK -> sluice serve -> fake", through)):
        cpu = record["proxy_cpu_ms_per_request"]
        rows.append(
            [
                name,
                f"{record['p50_ms']:.2f}",
                f"{record['p99_ms']:.2f}",
                f"{record['rps']:.0f}",
                "-" if "serve" not in name else _cell(cpu),
            ]
        )
    print(f"{versions_line()}; Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, no pinning")
    print(f"sequential: {args.sequential} requests; concurrent: {args.n} at {args.concurrency}\n")
    print(
        markdown_table(
            ["path", "p50 ms", "p99 ms", f"req/s at {args.concurrency}", "proxy CPU ms/request"],
            rows,
            right=(1, 2, 3, 4),
        )
    )
    print(
        f"\nadded by the proxy: p50 +{through['p50_ms'] - direct['p50_ms']:.2f} ms, "
        f"p99 +{through['p99_ms'] - direct['p99_ms']:.2f} ms"
    )
    path = save_results("proxy", {"args": vars(args), "direct": direct, "proxy": through})
    print(f"raw figures: {path}")
    return 0


def _cell(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


if __name__ == "__main__":
    sys.exit(main())
