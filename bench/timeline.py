"""What the timeline costs (issue 23): a store-backed ``Engine.map`` with and without it.

    python bench/timeline.py --n 100000 --rounds 5

A zero-latency fake server in its own process on one core; each run a process of its own
on the other: ``Engine.map`` over N requests with a fresh ``SqliteStore`` (intents
before each attempt, answers committed as they land, what a batch job does), either
``timeline=False`` (as before issue 23) or ``timeline=True`` (every attempt buffered and
written by the store's writer thread). The two alternate within each round, so a load
that comes and goes on the machine charges both alike. Reported: CPU ms per request of
the whole process (from ``wait4``: the writer thread included), wall seconds, and the
timeline's cost as the median of the per-round ratios.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import FakeServerProcess, cpu_plan, machine_line, markdown_table, median, save_results
from batch import MODEL, prompt, run_measured


def worker(url: str, n: int, concurrency: int, state: str, timeline: bool) -> None:
    import asyncio

    import sluice
    from sluice.store import SqliteStore

    async def main() -> dict[str, Any]:
        store = SqliteStore(state, exclusive=True, expected_keys=n, timeline=timeline)
        deployment = sluice.Deployment(MODEL, base_url=url, api_key="x")
        requests = (sluice.Request.from_prompt(MODEL, prompt(i), max_tokens=16) for i in range(n))
        try:
            async with sluice.Engine(deployment, concurrency=concurrency, store=store) as engine:
                started = time.perf_counter()
                ok = 0
                async for result in engine.map(requests):
                    ok += result.ok
                seconds = time.perf_counter() - started
        finally:
            store.close()
        return {"ok": ok, "seconds": seconds}

    print(json.dumps(asyncio.run(main())), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--worker", nargs=3, metavar=("URL", "STATE", "TIMELINE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        url, state, timeline = args.worker
        worker(url, args.n, args.concurrency, state, timeline == "on")
        return
    server_cpus, client_cpus = cpu_plan()
    runs: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
    with tempfile.TemporaryDirectory(prefix="sluice-timeline-") as folder:
        for round_ in range(args.rounds):
            order = ("off", "on") if round_ % 2 == 0 else ("on", "off")
            for mode in order:
                state = Path(folder) / f"{mode}-{round_}.db"
                with FakeServerProcess(["--latency", "0", "--output-tokens", "16"], cpus=server_cpus) as server:
                    command = [sys.executable, __file__, "--n", str(args.n), "--concurrency", str(args.concurrency)]
                    command += ["--worker", server.openai_url, str(state), mode]
                    _, rss, printed, cpu = run_measured(command, {}, client_cpus)
                done = json.loads(printed.strip().splitlines()[-1])
                runs[mode].append({"seconds": done["seconds"], "ok": done["ok"], "cpu": cpu, "rss": rss})
                for stale in Path(folder).glob(f"{mode}-{round_}.db*"):
                    stale.unlink()
    ratios = [on["cpu"] / off["cpu"] for on, off in zip(runs["on"], runs["off"], strict=True)]
    table = [
        [
            f"timeline {mode}",
            f"{args.n:,}",
            f"{median([r['seconds'] for r in done]):.1f}",
            f"{median([r['cpu'] / r['ok'] * 1000 for r in done]):.4f}",
            f"{max(r['rss'] for r in done) / 2**20:.0f}",
        ]
        for mode, done in runs.items()
    ]
    print(f"# the timeline's cost: Engine.map + SqliteStore, {args.n:,} requests, {args.rounds} rounds, median shown")
    print(machine_line())
    print()
    print(
        markdown_table(["store", "requests", "seconds", "CPU ms / request", "peak RSS MB"], table, right=[1, 2, 3, 4])
    )
    print()
    spread = f"{min(ratios):.3f}–{max(ratios):.3f}"
    print(f"CPU with the timeline / without, per round: median {median(ratios):.3f} ({spread})")
    save_results("timeline", {"n": args.n, "rounds": args.rounds, "runs": runs, "ratios": ratios})


if __name__ == "__main__":
    main()
