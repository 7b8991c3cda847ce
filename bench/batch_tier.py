"""A batch-tier job: `sluice run --tier batch` over an N-line file through the fake's Batch API.

    python bench/batch_tier.py --n 100000     # ~1 min on 2 cores
    python bench/batch_tier.py --n 50000 200000 1000000 --tier sync batch auto   # the issue-38 table

The fake server (``python -m sluice.testing``) runs in its own process on one core and
answers each batch at once (``--batch-start-after 0``); ``sluice run`` runs on the other.
Reported: wall time, CPU per line and peak RSS of the ``sluice run`` process (``wait4``),
the batches it made, and **the delay from the provider finishing to the output being
written**: for each batch, from its ``completed_at`` (the fake's clock, the same machine's)
to when the run had written every one of its lines (the process's end for the last
batch; the poll period bounds the wait for each). ``--tier sync`` runs the same job
synchronously, ``auto`` with a deadline a day away (all of it in batches). The run also
checks that every line was answered once and that a ``--tier batch`` job sent nothing
synchronously; ``answered sync`` counts the lines ``--tier auto`` sent synchronously (a
batch that failed them).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import FakeServerProcess, cpu_plan, machine_line, markdown_table, save_results
from batch import run_measured, write_input

if TYPE_CHECKING:
    from collections.abc import Iterator

MODEL = "openai/bench"


@contextlib.contextmanager
def job_on_fake(
    n: int, folder: Path, output: Path, start_after: float, server_cpus: set[int] | None
) -> Iterator[tuple[FakeServerProcess, list[str], dict[str, str]]]:
    """A fresh fake (answering each batch ``start_after`` s after it is made) and the
    ``sluice run`` command and environment of an ``n``-line job against it."""
    source = folder / f"in-{n}.jsonl"
    if not source.exists():
        write_input(source, n)
    fake = ["--latency", "0", "--output-tokens", "16", "--batch-start-after", str(start_after)]
    with FakeServerProcess(fake, cpus=server_cpus) as server:
        env = {**os.environ, "NO_COLOR": "1", "OPENAI_BASE_URL": server.openai_url, "OPENAI_API_KEY": "x"}
        yield server, [sys.executable, "-m", "sluice", "run", str(source), "-o", str(output), "--model", MODEL], env


def provider_batches(url: str) -> list[dict[str, Any]]:
    """The batches the fake holds (its Batch API's list)."""
    request = urllib.request.Request(f"{url}/batches?limit=1000", headers={"Authorization": "Bearer x"})
    with urllib.request.urlopen(request) as response:
        data: list[dict[str, Any]] = json.loads(response.read())["data"]
        return data


def run_one(n: int, tier: str, args: argparse.Namespace, folder: Path) -> list[str]:
    """One ``sluice run`` of ``n`` lines at ``tier`` against a fresh fake; its table row."""
    server_cpus, client_cpus = cpu_plan()
    output = folder / f"out-{tier}-{n}.jsonl"
    with job_on_fake(n, folder, output, args.start_after, server_cpus) as (server, cli, env):
        cli += ["--log-every", "60"]
        if tier != "sync":
            cli += ["--tier", tier, "--batch-size", str(args.batch_size), "--poll-every", str(args.poll_every)]
        if tier == "auto":
            cli += ["--deadline", "24h"]
        seconds, rss, _, cpu = run_measured(cli, env, client_cpus)
        ended = time.time()
        stats = server.stats()
        batches = provider_batches(server.openai_url)
    records = synchronous = 0
    with output.open() as lines:
        for line in lines:
            record = json.loads(line)
            assert record["ok"], record
            synchronous += record["tier"] == "sync"
            records += 1
    output.unlink()
    assert records == n, f"{records:,} records for {n:,} lines"
    assert stats.get("duplicate_successes", 0) == 0, "a line was answered twice"
    assert tier != "batch" or synchronous == stats.get("received", 0) == 0, "a batch job sent synchronous requests"
    finished = sorted(float(b["completed_at"] or 0) for b in batches)
    spans = [(float(b["created_at"]), float(b["completed_at"] or 0)) for b in batches]
    at_once = max((sum(1 for c, e in spans if c <= t < e) for t, _ in spans), default=0)
    # completed_at is whole seconds: the delay is accurate to about a second
    delay_last = f"{ended - finished[-1]:.1f}" if finished else "-"
    row = [tier, f"{n:,}", str(len(batches)), f"{seconds:.1f}", f"{cpu / n * 1000:.3f}", f"{rss / 2**20:.0f}"]
    return [*row, str(at_once), delay_last, f"{synchronous:,}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, nargs="+", default=[100_000], help="lines of each job (several: one each)")
    parser.add_argument(
        "--tier", nargs="+", default=["batch"], choices=["sync", "batch", "auto"], help="tiers to run each size at"
    )
    parser.add_argument("--batch-size", type=int, default=10_000)
    parser.add_argument("--poll-every", type=float, default=1.0)
    parser.add_argument(
        "--start-after",
        type=float,
        default=0.0,
        help="seconds each batch waits at the fake before it starts (a queue: the job's batches pile up there)",
    )
    args = parser.parse_args()

    print(
        f"# batch tier: {', '.join(f'{n:,}' for n in args.n)} lines at {', '.join(args.tier)}, batches of "
        f"{args.batch_size:,}, polled every {args.poll_every:g} s at most, each batch starting "
        f"{args.start_after:g} s after it is created"
    )
    print(machine_line(), f"load average at the start {os.getloadavg()[0]:.1f}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="sluice-batch-tier-") as folder:
        for n in args.n:
            for tier in args.tier:
                rows.append(run_one(n, tier, args, Path(folder)))
                print("  ", " | ".join(rows[-1]), flush=True)
    print(f"load average at the end {os.getloadavg()[0]:.1f}")
    print()
    headers = ["tier", "lines", "batches", "seconds", "CPU ms / line", "peak RSS MB"]
    headers += ["batches at the provider at once", "last batch done -> output written, s", "answered sync"]
    print(markdown_table(headers, rows, right=[1, 2, 3, 4, 5, 6, 7, 8]))
    print()
    print("every job: one record per line, answered once (no duplicate success); --tier batch sent no sync request")
    save_results("batch_tier", {"args": vars(args), "rows": rows})


if __name__ == "__main__":
    main()
