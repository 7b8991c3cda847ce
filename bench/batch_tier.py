"""A batch-tier job: `sluice run --tier batch` over an N-line file through the fake's Batch API.

    python bench/batch_tier.py --n 100000     # ~1 min on 2 cores

The fake server (``python -m sluice.testing``) runs in its own process on one core and
answers each batch at once (``--batch-start-after 0``); ``sluice run`` runs on the other.
Reported: wall time, CPU per line and peak RSS of the ``sluice run`` process (``wait4``),
the batches it made, and **the delay from the provider finishing to the output being
written**: for each batch, from its ``completed_at`` (the fake's clock, the same machine's)
to when the run had written every one of its lines (the process's end for the last
batch; the poll period bounds the wait for each). The run also checks that every line
was answered once, by a batch, and that nothing was sent synchronously.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import FakeServerProcess, cpu_plan, machine_line, markdown_table, save_results
from batch import run_measured, write_input

MODEL = "openai/bench"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--batch-size", type=int, default=10_000)
    parser.add_argument("--poll-every", type=float, default=1.0)
    parser.add_argument(
        "--start-after",
        type=float,
        default=0.0,
        help="seconds each batch waits at the fake before it starts (a queue: the job's batches pile up there)",
    )
    args = parser.parse_args()

    server_cpus, client_cpus = cpu_plan()
    with tempfile.TemporaryDirectory(prefix="sluice-batch-tier-") as folder:
        source, output = Path(folder) / "in.jsonl", Path(folder) / "out.jsonl"
        write_input(source, args.n)
        fake = ["--latency", "0", "--output-tokens", "16", "--batch-start-after", str(args.start_after)]
        with FakeServerProcess(fake, cpus=server_cpus) as server:
            env = {**os.environ, "NO_COLOR": "1", "OPENAI_BASE_URL": server.openai_url, "OPENAI_API_KEY": "x"}
            cli = [sys.executable, "-m", "sluice", "run", str(source), "-o", str(output), "--model", MODEL]
            cli += ["--tier", "batch", "--batch-size", str(args.batch_size), "--poll-every", str(args.poll_every)]
            cli += ["--log-every", "60"]
            seconds, rss, _, cpu = run_measured(cli, env, client_cpus)
            ended = time.time()
            stats = server.stats()
            request = urllib.request.Request(
                f"{server.openai_url}/batches?limit=100", headers={"Authorization": "Bearer x"}
            )
            with urllib.request.urlopen(request) as response:
                batches = json.loads(response.read())["data"]
        records = [json.loads(line) for line in output.open()]

    assert all(r["ok"] and r["tier"] == "batch" for r in records), "a line was not answered by a batch"
    finished = sorted(float(b["completed_at"] or 0) for b in batches)
    spans = [(float(b["created_at"]), float(b["completed_at"] or 0)) for b in batches]
    at_once = max((sum(1 for c, e in spans if c <= t < e) for t, _ in spans), default=0)
    # completed_at is whole seconds: the delay is accurate to about a second
    delay_last = ended - finished[-1] if finished else float("nan")
    rows = [
        [
            f"{len(records):,}",
            str(len(batches)),
            f"{seconds:.1f}",
            f"{cpu / len(records) * 1000:.3f}",
            f"{rss / 2**20:.0f}",
            str(at_once),
            f"{delay_last:.1f}",
        ]
    ]
    print(
        f"# batch tier: {args.n:,} lines, batches of {args.batch_size:,}, polled every {args.poll_every:g} s, "
        f"each batch starting {args.start_after:g} s after it is created"
    )
    print(machine_line())
    print()
    headers = ["lines", "batches", "seconds", "CPU ms / line", "peak RSS MB", "batches at the provider at once"]
    headers.append("last batch done -> output written, s")
    print(markdown_table(headers, rows, right=[0, 1, 2, 3, 4, 5, 6]))
    print()
    print(
        f"server: {stats.get('received', 0):,} synchronous requests (expected 0), {stats.get('accepted', 0):,} lines "
        f"answered for {args.n:,}, duplicate successes {stats.get('duplicate_successes', 0)} (expected 0)"
    )
    save_results(
        "batch_tier",
        {
            "n": args.n,
            "start_after": args.start_after,
            "seconds": seconds,
            "cpu": cpu,
            "rss": rss,
            "batches": len(batches),
            "at_once": at_once,
            "delay_last": delay_last,
        },
    )


if __name__ == "__main__":
    main()
