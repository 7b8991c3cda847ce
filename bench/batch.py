"""A big batch job: `sluice run` over an N-line file vs the library path, same server.

    python bench/batch.py                 # N = 1,000,000 (about 40 min on 2 cores)
    python bench/batch.py --n 100000      # a quicker look

A zero-latency fake server runs in its own process on one core; each path runs in its
own process on the other:

* library: ``Engine.map`` over a generator of the same requests (nothing read from disk,
  nothing stored) — the floor for what the CLI adds;
* cli: ``sluice run INPUT -o OUTPUT`` — reads the file, stores every answer in SQLite as
  it lands, writes the output, shows progress; on uvloop, the command's default where it
  is installed;
* cli on asyncio: the same with ``SLUICE_LOOP=asyncio`` (the default loop), to measure
  what uvloop gives.

Reported per path: wall time, records/s, peak RSS of that process (``wait4``), and the
CLI's rate as a ratio to the library's. Targets (issue 3): CLI peak RSS < 200 MB
however big the input, and CLI throughput >= 0.8 x the library path (issue 12; issue 3 asked
0.6 x). Each process's CPU seconds per record are reported too: steadier than the rates
when other work shares the machine. The run also checks
that the output has exactly one record per line and that the server saw no request twice.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import FakeServerProcess, cpu_plan, machine_line, markdown_table, median, save_results

MODEL = "openai/bench"


def prompt(i: int) -> str:
    return f"Classify support ticket #{i}: 'my sluice gate is stuck half open'"


def write_input(path: Path, n: int) -> None:
    with path.open("w") as f:
        for i in range(n):
            f.write(json.dumps({"messages": [{"role": "user", "content": prompt(i)}], "max_tokens": 16}) + "\n")


def library_worker(url: str, n: int, concurrency: int) -> None:
    """Runs in its own process: the library path, printing one JSON line."""
    import asyncio

    import sluice

    async def main() -> dict[str, Any]:
        deployment = sluice.Deployment(MODEL, base_url=url, api_key="x")
        requests = (sluice.Request.from_prompt(MODEL, prompt(i), max_tokens=16) for i in range(n))
        async with sluice.Engine(deployment, concurrency=concurrency) as engine:
            started = time.perf_counter()
            ok = 0
            async for result in engine.map(requests):
                ok += result.ok
            return {"ok": ok, "seconds": time.perf_counter() - started}

    print(json.dumps(asyncio.run(main())), flush=True)


def run_measured(command: list[str], env: dict[str, str], cpus: set[int] | None) -> tuple[float, int, str, float]:
    """Run a command; its wall seconds, peak RSS in bytes and CPU seconds (from wait4), and stdout."""
    preexec = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    started = time.perf_counter()
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, preexec_fn=preexec)
    assert process.stdout is not None
    output = process.stdout.read().decode()
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - started
    if process.returncode != 0:
        raise RuntimeError(f"{command[:4]} exited {process.returncode}: {output[-500:]}")
    return seconds, usage.ru_maxrss * 1024, output, usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=1, help="library and cli runs, interleaved (median shown)")
    parser.add_argument("--worker-library", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker_library:
        library_worker(args.worker_library, args.n, args.concurrency)
        return

    server_cpus, client_cpus = cpu_plan()
    cli_runs = {"cli (sluice run)": "auto", "cli on asyncio (SLUICE_LOOP=asyncio)": "asyncio"}
    runs: dict[str, list[dict[str, float]]] = {"library (Engine.map)": [], **{name: [] for name in cli_runs}}
    received = duplicates = 0
    with tempfile.TemporaryDirectory(prefix="sluice-batch-") as folder:
        source, output = Path(folder) / "in.jsonl", Path(folder) / "out.jsonl"
        write_input(source, args.n)
        env = {**os.environ, "NO_COLOR": "1"}

        def fresh_server() -> FakeServerProcess:
            # One server per run: the fake remembers every request it answered (to count
            # duplicates), and a server that has already answered the other path's N
            # requests is slower, which would charge one path for the other's work.
            return FakeServerProcess(["--latency", "0", "--output-tokens", "16"], cpus=server_cpus)

        for _ in range(args.rounds):
            with fresh_server() as server:
                command = [sys.executable, __file__, "--n", str(args.n), "--concurrency", str(args.concurrency)]
                _, rss, printed, cpu = run_measured([*command, "--worker-library", server.openai_url], env, client_cpus)
                stats = server.stats()
            library = json.loads(printed.strip().splitlines()[-1])
            runs["library (Engine.map)"].append(
                {"seconds": library["seconds"], "ok": library["ok"], "rss": rss, "cpu": cpu}
            )
            received += stats.get("received", 0)
            duplicates += stats.get("duplicate_successes", 0)

            for name, loop in cli_runs.items():
                for stale in Path(folder).glob("out*"):  # each run a fresh job, not a resumed one
                    stale.unlink()
                with fresh_server() as server:
                    cli_env = {**env, "OPENAI_BASE_URL": server.openai_url, "OPENAI_API_KEY": "x", "SLUICE_LOOP": loop}
                    cli = [sys.executable, "-m", "sluice", "run", str(source), "-o", str(output), "--model", MODEL]
                    cli += ["--concurrency", str(args.concurrency), "--log-every", "60"]
                    seconds, rss, _, cpu = run_measured(cli, cli_env, client_cpus)
                    stats = server.stats()
                lines = sum(1 for _ in output.open())
                runs[name].append({"seconds": seconds, "ok": lines, "rss": rss, "cpu": cpu})
                received += stats.get("received", 0)
                duplicates += stats.get("duplicate_successes", 0)

    library_rates = [r["ok"] / r["seconds"] for r in runs["library (Engine.map)"]]
    table = []
    for name, done in runs.items():
        rates = [r["ok"] / r["seconds"] for r in done]
        ratios = [rate / lib for rate, lib in zip(rates, library_rates, strict=True)]
        table.append(
            [
                name,
                f"{int(done[0]['ok']):,}",
                f"{median([r['seconds'] for r in done]):.1f}",
                f"{median(rates):,.0f}",
                f"{median([r['cpu'] / r['ok'] * 1000 for r in done]):.3f}",
                f"{max(r['rss'] for r in done) / 2**20:.0f}",
                f"{median(ratios):.2f}" + (f" ({min(ratios):.2f}–{max(ratios):.2f})" if len(ratios) > 1 else ""),
            ]
        )
    print(
        f"# batch job: {args.n:,} lines, zero-latency fake server, concurrency {args.concurrency}, "
        f"{args.rounds} round(s), median shown"
    )
    print(machine_line())
    print()
    headers = ["path", "records", "seconds", "records/s", "CPU ms / record", "peak RSS MB", "x library"]
    print(markdown_table(headers, table, right=[1, 2, 3, 4, 5, 6]))
    print()
    print("targets: cli peak RSS < 200 MB; cli >= 0.8 x library (issue 12)")
    print(
        f"servers (a fresh one per run): {received:,} requests received for {len(runs) * args.n * args.rounds:,} sent; "
        f"duplicate successes: {duplicates} (expected 0)"
    )
    save_results(
        "batch", {"n": args.n, "rounds": args.rounds, "runs": runs, "received": received, "duplicates": duplicates}
    )


if __name__ == "__main__":
    main()
