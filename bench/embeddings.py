"""Embedding a corpus: N texts through sluice's embeddings pipeline against the fake server.

    python bench/embeddings.py                       # N = 100,000 texts, 256 dimensions
    python bench/embeddings.py --n 20000 --dimensions 1536

A zero-latency fake server (``python -m sluice.testing``) runs in its own process on one
core; each path runs in its own process on the other:

* library: ``Engine.embed_map`` over a generator of texts, nothing stored (vectors as
  JSON numbers on the wire, the default for a server that is not OpenAI's);
* library, base64: the same with ``encoding_format: "base64"`` on the wire (OpenAI's default);
* library + store: every vector stored in SQLite (float32 BLOBs) as it lands;
* rerun from the store: the same texts again on that state: nothing may be sent;
* cli: ``sluice run`` over an N-line OpenAI Batch API file of ``/v1/embeddings`` lines
  (``encoding_format: "base64"``: the records hold base64 vectors), state and output written.

Reported per path: requests the server received, wall time, texts/s and peak RSS of that
process (``wait4``). A client sending one text per request would send N requests.
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

from _common import FakeServerProcess, cpu_plan, machine_line, markdown_table, save_results

MODEL = "openai/text-embedding-3-small"


def text(i: int) -> str:
    return f"Support ticket #{i}: the sluice gate on canal section {i % 97} is stuck half open again."


def library_worker(url: str, n: int, dimensions: int, encoding: str, state: str | None) -> None:
    """Runs in its own process: one library path, printing one JSON line."""
    import asyncio

    import sluice
    from sluice.store import SqliteStore

    async def main() -> dict[str, Any]:
        options = {"embedding_encoding": encoding}
        deployment = sluice.Deployment(MODEL, base_url=url, api_key="x", options=options)
        store = SqliteStore(state) if state else None
        try:
            async with sluice.Engine(deployment, store=store) as engine:
                started = time.perf_counter()
                ok = 0
                async for result in engine.embed_map((text(i) for i in range(n)), model=MODEL, dimensions=dimensions):
                    ok += result.ok and len(result.vector or ()) == dimensions
                seconds = time.perf_counter() - started
                return {"ok": ok, "seconds": seconds, "cached": engine.stats.cached}
        finally:
            if store is not None:
                store.close()

    print(json.dumps(asyncio.run(main())), flush=True)


def run_measured(command: list[str], env: dict[str, str], cpus: set[int] | None) -> tuple[float, int, str]:
    """Run a command; its wall seconds, peak RSS in bytes (from wait4) and stdout."""
    preexec = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    started = time.perf_counter()
    with tempfile.TemporaryFile() as errors:
        process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=errors, preexec_fn=preexec)
        assert process.stdout is not None
        output = process.stdout.read().decode()
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        seconds = time.perf_counter() - started
        if process.returncode != 0:
            errors.seek(0)
            raise RuntimeError(f"{command[:5]} exited {process.returncode}: {errors.read().decode()[-800:]}")
    return seconds, usage.ru_maxrss * 1024, output


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--dimensions", type=int, default=256)
    parser.add_argument("--worker", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--encoding", default="float", help=argparse.SUPPRESS)
    parser.add_argument("--state", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        library_worker(args.worker, args.n, args.dimensions, args.encoding, args.state)
        return

    server_cpus, client_cpus = cpu_plan()
    rows: dict[str, dict[str, float]] = {}
    env = {**os.environ, "NO_COLOR": "1"}
    with tempfile.TemporaryDirectory(prefix="sluice-embed-") as folder:
        state = str(Path(folder) / "state.db")
        source, output = Path(folder) / "in.jsonl", Path(folder) / "out.jsonl"
        with source.open("w") as f:
            for i in range(args.n):
                body = {"model": MODEL, "input": text(i), "dimensions": args.dimensions, "encoding_format": "base64"}
                f.write(json.dumps({"custom_id": f"t{i}", "method": "POST", "url": "/v1/embeddings", "body": body}))
                f.write("\n")
        with FakeServerProcess(["--latency", "0"], cpus=server_cpus) as server:
            url = server.openai_url
            worker = [
                sys.executable,
                __file__,
                "--n",
                str(args.n),
                "--dimensions",
                str(args.dimensions),
                "--worker",
                url,
            ]
            paths = {
                "library (embed_map)": [*worker, "--encoding", "float"],
                "library, base64 on the wire": [*worker, "--encoding", "base64"],
                "library + store": [*worker, "--encoding", "base64", "--state", state],
                "rerun from the store": [*worker, "--encoding", "base64", "--state", state],
            }
            for name, command in paths.items():
                before = server.stats()["received"]
                seconds, rss, printed = run_measured(command, env, client_cpus)
                result = json.loads(printed.strip().splitlines()[-1])
                sent = server.stats()["received"] - before
                rows[name] = {"ok": result["ok"], "seconds": seconds, "rss": rss, "requests": sent}

            cli_env = {**env, "OPENAI_BASE_URL": url, "OPENAI_API_KEY": "x"}
            cli = [sys.executable, "-m", "sluice", "run", str(source), "-o", str(output), "--log-every", "60"]
            before = server.stats()["received"]
            seconds, rss, _ = run_measured(cli, cli_env, client_cpus)
            lines = sum(1 for _ in output.open())
            sent = server.stats()["received"] - before
            rows["cli (sluice run, Batch API lines)"] = {"ok": lines, "seconds": seconds, "rss": rss, "requests": sent}
            stats = server.stats()

    table = [
        [
            name,
            f"{int(row['ok']):,}",
            f"{int(row['requests']):,}",
            f"{row['seconds']:.1f}",
            f"{row['ok'] / row['seconds']:,.0f}",
            f"{row['rss'] / 2**20:.0f}",
        ]
        for name, row in rows.items()
    ]
    print(f"# embeddings: {args.n:,} texts, {args.dimensions} dimensions, zero-latency fake server")
    print(machine_line())
    print()
    print(
        markdown_table(["path", "texts", "requests", "seconds", "texts/s", "peak RSS MB"], table, right=[1, 2, 3, 4, 5])
    )
    print()
    print(f"a client sending one text per request would send {args.n:,} requests per path")
    print(f"server: {stats.get('received')} received in all; by status {stats.get('by_status')}")
    save_results("embeddings", {"n": args.n, "dimensions": args.dimensions, "rows": rows, "server": stats})


if __name__ == "__main__":
    main()
