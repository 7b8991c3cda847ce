"""Instructions per call: each client's cost counted by Valgrind, not timed.

    python bench/instructions.py [--clients raw-aiohttp,sluice] [--server minimal|fake]

On a shared VM the wall-clock figures of ``throughput.py`` move by +-25 % from one run to
the next, as much as the differences worth measuring. Valgrind's ``callgrind`` counts the
instructions a client executes, which repeats far better: within ~0.3 % most runs, but
the garbage collector's timing moves a run by up to ~3 % now and then, so compare the
medians of a few runs; ``--frozen`` (the start-up heap left out of every collection)
narrows that to ~1 %, still too much to see a change of 1 % in one run; more calls
(``--small 1000 --large 8000``) spread a run's few large events over more of them and
repeat to ~1 % (two of three runs within 0.1 % in the runs recorded). Each client (the
same clients as ``throughput.py``, the same request shape and concurrency) runs twice
under callgrind, once with ``--small`` and once with ``--large`` calls after the same warm-up;
the difference divided by the difference in calls is its cost per call, without the
interpreter's start-up and imports. Instructions are not time: syscalls (the same for
every client) and cache misses are not in them, so the ratio overstates the gap in CPU
time a little. Needs ``valgrind`` on the PATH (``apt-get install valgrind``); ~1.5 min a
client.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from _clients import CLIENTS, LABELS, REQUIRES, Settings, make_client
from _common import FakeServerProcess, machine_line, markdown_table, module_available, versions_line, worker_env
from throughput import MinimalServerProcess, prompt

SCRIPT = Path(__file__).resolve()
_COLLECTED = re.compile(rb"Collected : (\d+)")


async def _run_client(client_name: str, url: str, n: int, concurrency: int, model: str, frozen: bool) -> None:
    settings = Settings(url=url, concurrency=concurrency, max_tokens=16, model=model)
    client = make_client(client_name, settings)
    try:
        await client.run([prompt(i) for i in range(10**6, 10**6 + 300)])  # warm: connections, code paths
        if frozen:  # what exists now (imports, the warm-up's leftovers) is left out of every collection
            gc.collect()
            gc.freeze()
        tally = await client.run([prompt(i) for i in range(n)])
        if tally.errors:
            raise SystemExit(f"{client_name}: {tally.errors} errors")
    finally:
        await client.aclose()


def _instructions(client: str, url: str, n: int, args: argparse.Namespace) -> int:
    command = [
        "valgrind",
        "--tool=callgrind",
        "--callgrind-out-file=/dev/null",
        sys.executable,
        str(SCRIPT),
        "--worker",
        client,
        "--url",
        url,
        "--n",
        str(n),
        "--concurrency",
        str(args.concurrency),
        "--model",
        args.model,
        *(["--frozen"] if args.frozen else []),
    ]
    done = subprocess.run(command, capture_output=True, env=worker_env(), check=False)
    found = _COLLECTED.search(done.stderr)
    if done.returncode != 0 or found is None:
        raise SystemExit(f"{client} under valgrind failed:\n{done.stderr.decode(errors='replace')[-2000:]}")
    return int(found.group(1))


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.worker:
        asyncio.run(_run_client(args.worker, args.url, args.n, args.concurrency, args.model, args.frozen))
        return 0
    if shutil.which("valgrind") is None:
        print("valgrind is not on the PATH: apt-get install valgrind", file=sys.stderr)
        return 2
    clients = [c.strip() for c in args.clients.split(",") if c.strip()]
    unknown = [c for c in clients if c not in CLIENTS]
    if unknown:
        print(f"unknown client(s) {', '.join(unknown)}; choose from {', '.join(CLIENTS)}", file=sys.stderr)
        return 2
    if args.large <= args.small:
        print("--large must be more than --small", file=sys.stderr)
        return 2
    server_type = MinimalServerProcess if args.server == "minimal" else FakeServerProcess
    with server_type() as server:
        url = server.openai_url
        per_call: dict[str, float] = {}
        for client in clients:
            if not module_available(REQUIRES[client]):
                print(f"{client}: not installed", file=sys.stderr)
                continue
            small = _instructions(client, url, args.small, args)
            large = _instructions(client, url, args.large, args)
            per_call[client] = (large - small) / (args.large - args.small)
            print(f"{client}: {per_call[client]:,.0f} instructions a call", file=sys.stderr, flush=True)
    floor = per_call.get("raw-aiohttp")
    rows = [
        [LABELS.get(client, client), f"{cost:,.0f}", f"{cost / floor:.2f}" if floor else "-"]
        for client, cost in per_call.items()
    ]
    print(machine_line())
    print(versions_line())
    print(
        f"server: {args.server}; model {args.model}; concurrency {args.concurrency}; {args.small} vs {args.large} calls\n"
    )
    print(markdown_table(["client", "instructions / call", "x raw aiohttp"], rows, right=(1, 2)))
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--clients", default="raw-aiohttp,sluice", help=f"comma-separated, of {', '.join(CLIENTS)}")
    add("--server", choices=["minimal", "fake"], default="minimal", help="as throughput.py's --server")
    add("--model", default="gpt-4o-mini", help="the model the server sees (default gpt-4o-mini: a known price)")
    add("--concurrency", type=int, default=100)
    add("--small", type=int, default=500, help="calls of the first run (default 500)")
    add("--large", type=int, default=2500, help="calls of the second run (default 2500)")
    add(
        "--frozen",
        action="store_true",
        help="gc.freeze() after the warm-up: full collections no longer walk the start-up heap, whose "
        "timing moves a run by up to ~3 %%; steadier for comparing two versions of one client, but "
        "not what a script pays",
    )
    add("--worker", default="", help=argparse.SUPPRESS)
    add("--url", default="", help=argparse.SUPPRESS)
    add("--n", type=int, default=0, help=argparse.SUPPRESS)
    return parser


if __name__ == "__main__":
    raise SystemExit(main())
