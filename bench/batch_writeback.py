"""How fast a parked job writes its lines out once its provider batches have ended.

    python bench/batch_writeback.py --n 100000 --start-after 60
    python bench/batch_writeback.py --n 100000 --start-after 60 --py-spy /tmp/wb.txt   # where it goes

``sluice run --tier batch`` over an N-line file against the fake (its own core; the job on
the other), whose batches wait ``--start-after`` seconds before they start: long enough
that every batch is created (every line parked) before the first one ends, so what follows
is the write-back alone: each ended batch's output file downloaded, parsed and journalled,
its lines read again, answered from the journal and written (output + state). Reported:
lines written a second from the first batch's end to the job's end (wall), and the CPU
the job spent in that span (``/proc`` at the first end, ``wait4`` at the exit), per line
and as lines a second of one core. ``--py-spy FILE`` samples the job over that span only
(py-spy, raw stacks). The issue-38 target: >= 30,000 lines a second on one core.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import cpu_plan, machine_line, markdown_table, save_results
from batch_tier import job_on_fake, provider_batches


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_once(n: int, args: argparse.Namespace, folder: Path) -> dict[str, float]:
    server_cpus, client_cpus = cpu_plan()
    output = folder / "out.jsonl"
    with job_on_fake(n, folder, output, args.start_after, server_cpus) as (server, cli, env):
        cli += ["--log-every", "600", "--tier", "batch", "--batch-size", str(args.batch_size), "--poll-every", "1"]
        preexec = (lambda: os.sched_setaffinity(0, client_cpus)) if client_cpus else None
        started = time.time()
        job = subprocess.Popen(cli, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=preexec)
        first_end = cpu_at_end = 0.0
        created = 0
        sampler = None
        while True:
            pid, status, usage = os.wait4(job.pid, os.WNOHANG)
            if pid:
                break
            if not first_end:
                batches = provider_batches(server.openai_url)
                ended = [float(b["completed_at"]) for b in batches if b.get("completed_at")]  # type: ignore[arg-type]
                if ended:
                    cpu_at_end, first_end, created = _cpu_seconds(job.pid), min(ended), len(batches)
                    if args.py_spy:
                        spy = ["py-spy", "record", "-r", "100", "-f", "raw", "-o", args.py_spy, "--pid", str(job.pid)]
                        sampler = subprocess.Popen(spy, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(0.1)
        finished = time.time()
        if sampler is not None:
            sampler.wait(timeout=60)
        batches = provider_batches(server.openai_url)
    assert os.waitstatus_to_exitcode(status) == 0, "the job failed"
    with output.open() as lines:
        written = sum(1 for _ in lines)
    output.unlink()
    for stale in folder.glob("out.sluice.db*"):
        stale.unlink()
    assert written == n, f"{written:,} records for {n:,} lines"
    assert created == len(batches), "a batch ended before the job had created them all: raise --start-after"
    cpu = usage.ru_utime + usage.ru_stime - cpu_at_end
    span = finished - first_end  # completed_at is whole seconds: about a second either way
    return {"n": n, "batches": len(batches), "span": span, "cpu": cpu, "all": finished - started}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--batch-size", type=int, default=10_000)
    parser.add_argument("--start-after", type=float, default=60.0, help="seconds each batch waits at the fake")
    parser.add_argument("--py-spy", metavar="FILE", help="sample the write-back with py-spy into FILE")
    args = parser.parse_args()
    print(f"# write-back of a {args.n:,}-line --tier batch job (batches of {args.batch_size:,})")
    print(machine_line(), f"load average at the start {os.getloadavg()[0]:.1f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="sluice-writeback-") as folder:
        got = run_once(args.n, args, Path(folder))
    print(f"load average at the end {os.getloadavg()[0]:.1f}")
    headers = ["lines", "batches", "first batch ended -> written, s", "lines/s (wall)", "CPU s", "CPU us / line"]
    headers.append("lines/s of one core")
    n, span, cpu = got["n"], got["span"], got["cpu"]
    row = [f"{n:,.0f}", f"{got['batches']:.0f}", f"{span:.1f}", f"{n / span:,.0f}", f"{cpu:.1f}"]
    row += [f"{cpu / n * 1e6:.0f}", f"{n / cpu:,.0f}"]
    print(markdown_table(headers, [row], right=list(range(7))))
    save_results("batch_writeback", {"args": vars(args), "result": got})


if __name__ == "__main__":
    main()
