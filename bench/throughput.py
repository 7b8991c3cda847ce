"""Throughput: how many calls per second each client gets through a zero-latency fake server.

    python bench/throughput.py [--n 3000] [--concurrency 100] [--rounds 3]

The fake server (``python -m sluice.testing``, no limits, no latency) runs in its own
process pinned to one core; each client runs in a worker process pinned to the other,
so what is measured is the client's own cost per call. Clients are interleaved across
rounds (the order rotates each round) and the median round is reported. Each worker
first sends ``--warmup`` calls untimed (connections opened, code paths warm), then times
N calls with ``time.perf_counter`` (wall) and ``time.process_time`` (client CPU).

``--profile`` also runs the sluice client once under cProfile and prints where its
CPU time goes.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import os
import pstats
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Self

from _clients import CLIENTS, LABELS, REQUIRES, NotInstalledError, Settings, make_client
from _common import (
    FakeServerProcess,
    cpu_plan,
    import_seconds,
    machine_line,
    markdown_table,
    median,
    module_available,
    pin_self,
    run_worker,
    save_results,
    versions_line,
    worker_env,
    worker_main,
)

SCRIPT = Path(__file__).resolve()
TARGET_RATIO = 0.85

#: What "import s" measures for each client (median of fresh interpreters).
IMPORTS = {
    "raw-aiohttp": "import aiohttp",
    "sluice": "import sluice",
    "openai": "import openai",
    "litellm-router": "import litellm",
}
#: Further import figures printed under the table.
IMPORT_DETAILS = (
    ("import sluice", "import sluice"),
    ("import sluice; sluice.Engine", "import sluice; sluice.Engine"),
    ("... + aiohttp (what a first HTTP call adds)", "import sluice, aiohttp; sluice.Engine"),
)


def prompt(i: int) -> str:
    """The same shape for every client: one short user message, distinct per call."""
    return f"Benchmark request {i:06d}: in one short sentence, what does a sluice gate do?"


# -- the worker (one client, one process) ---------------------------------------------------


async def _measure(args: argparse.Namespace) -> dict[str, Any]:
    settings = Settings(url=args.url, concurrency=args.concurrency, max_tokens=args.max_tokens, model=args.model)
    prompts = [prompt(i) for i in range(args.n)]
    # --cold: the clock runs from before the client's library is imported, with no warm-up
    # (what a script pays for its first N calls: imports, setup, price lookup, ramp-up)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    try:
        client = make_client(args.client, settings)
    except NotInstalledError as exc:
        return {"status": "not installed", "detail": str(exc)}
    profiler = cProfile.Profile() if args.profile_out else None
    try:
        if not args.cold:
            if args.warmup:
                await client.run([prompt(i) for i in range(args.n, args.n + args.warmup)])
            gc.collect()
            wall0, cpu0 = time.perf_counter(), time.process_time()
        if profiler is not None:
            profiler.enable()
        tally = await client.run(prompts)
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(args.profile_out)
    finally:
        await client.aclose()
    return {
        "status": "ok",
        "n": args.n,
        "seconds": wall,
        "cpu_seconds": cpu,
        "ok": tally.ok,
        "errors": tally.errors,
        "samples": tally.samples,
    }


def worker(args: argparse.Namespace) -> int:
    return worker_main(_measure, args)


# -- the orchestrator --------------------------------------------------------------------


def warmed(args: argparse.Namespace) -> int:
    """Untimed calls before each timed run."""
    return 0 if args.cold else args.warmup


def _worker_args(args: argparse.Namespace, client: str, url: str) -> list[str]:
    return [
        "--client",
        client,
        "--url",
        url,
        "--n",
        str(args.n),
        "--concurrency",
        str(args.concurrency),
        "--warmup",
        str(args.warmup),
        "--max-tokens",
        str(args.max_tokens),
        "--model",
        args.model,
        *(["--cold"] if args.cold else []),
    ]


def _rounds(args: argparse.Namespace, clients: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
    """Run every client ``rounds`` times, interleaved; the per-round records by client."""
    server_cpus, client_cpus = cpu_plan()
    runs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    server = _server_for(args, server_cpus)
    try:
        server.start()
        print(f"{args.server} server pid {server.pid} at {server.url}", file=sys.stderr)
        for round_no in range(args.rounds):
            for client in _round_order(clients, round_no):
                if not module_available(REQUIRES[client]):
                    runs[client].append({"status": "not installed", "round": round_no})
                    continue
                server_cpu = process_cpu_seconds(server.pid)
                outcome = run_worker(
                    SCRIPT,
                    _worker_args(args, client, server.openai_url),
                    timeout=args.timeout,
                    cpus=client_cpus,
                )
                record = outcome.result or {"status": "failed", "detail": outcome.error}
                if server_cpu is not None and outcome.result is not None:
                    after = process_cpu_seconds(server.pid)
                    if after is not None:  # warm-up calls included: the server answered those too
                        record["server_cpu_per_call"] = (after - server_cpu) / (args.n + warmed(args))
                if outcome.result is None:
                    record["stderr"] = outcome.stderr_tail
                record["round"] = round_no
                runs[client].append(record)
                print(f"round {round_no + 1}/{args.rounds} {client}: {_progress(record)}", file=sys.stderr)
    finally:
        server.stop()
    return runs


#: Clients fast enough to run back to back with raw aiohttp, so their per-round ratio
#: compares runs made seconds apart (this machine's speed drifts from run to run).
FAST = ("raw-aiohttp", "sluice", "sluice-gather")


# -- the minimal server (``--server minimal``) ------------------------------------------------

#: One canned chat completion: every client accepts it (the openai SDK and LiteLLM parse it).
_CANNED = (
    b'{"id":"chatcmpl-bench","object":"chat.completion","created":1796041168,"model":"bench",'
    b'"choices":[{"index":0,"message":{"role":"assistant","content":"A sluice gate controls the flow of water."},'
    b'"finish_reason":"stop"}],"usage":{"prompt_tokens":20,"completion_tokens":16,"total_tokens":36}}'
)
_ANSWER = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-request-id: req-bench\r\n"
    b"content-length: " + str(len(_CANNED)).encode() + b"\r\n\r\n" + _CANNED
)


class _MinimalHttp(asyncio.Protocol):
    """HTTP/1.1 keep-alive that answers every request with ``_ANSWER``, and nothing else.

    Written by hand on purpose: the benchmark needs a server whose cost per call is far
    below any client's (``python -m sluice.testing`` counts, bills and enforces limits,
    ~0.06 ms a call, which caps it at ~1.6 x raw aiohttp's rate on this machine)."""

    def __init__(self) -> None:
        self._buffer = b""
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer + data
        answers = 0
        while True:
            head_end = buffer.find(b"\r\n\r\n")
            if head_end < 0:
                break
            head = buffer[:head_end].lower()
            at = head.find(b"content-length:")
            length = 0
            if at >= 0:
                line_end = head.find(b"\r\n", at)
                length = int(head[at + 15 : line_end if line_end >= 0 else len(head)])
            end = head_end + 4 + length
            if len(buffer) < end:
                break
            buffer = buffer[end:]
            answers += 1
        self._buffer = buffer
        if answers and self._transport is not None:
            self._transport.write(_ANSWER * answers)


async def _serve_minimal() -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_MinimalHttp, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    print(f"listening on http://127.0.0.1:{port}", flush=True)
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    async with server:
        await stop.wait()


class MinimalServerProcess(FakeServerProcess):
    """This script's ``--serve-minimal`` in a subprocess (started and stopped as the fake is)."""

    def start(self) -> Self:
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the server
        command = [sys.executable, str(SCRIPT), "--serve-minimal"]
        self._proc = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            stdin=subprocess.DEVNULL,
            env=worker_env(),
            preexec_fn=(lambda: pin_self(self.cpus)) if self.cpus is not None else None,
        )
        try:
            self.url = self._read_url()
        except BaseException:
            self.stop()
            raise
        return self


def _server_for(args: argparse.Namespace, cpus: set[int] | None) -> FakeServerProcess:
    if args.server == "minimal":
        return MinimalServerProcess(cpus=cpus)
    return FakeServerProcess(["--latency", "0", "--output-tokens", str(args.max_tokens)], cpus=cpus)


def process_cpu_seconds(pid: int | None) -> float | None:
    """CPU seconds (user + system) a process has used so far, from ``/proc`` (Linux)."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def server_line(runs: dict[str, list[dict[str, Any]]], rows: list[dict[str, Any]]) -> str | None:
    """The fake server's own CPU per call and the rate that caps it at (one core), against
    the fastest client's: the benchmark measures clients only while this is well above."""
    per_call = [r["server_cpu_per_call"] for rs in runs.values() for r in rs if r.get("server_cpu_per_call")]
    rates = [row["rate"] for row in rows if row.get("status") == "ok"]
    if not per_call or not rates:
        return None
    cost = median(per_call)
    ceiling = 1 / cost if cost > 0 else float("inf")
    return (
        f"server: {cost * 1000:.3f} ms of its core per call (median of {len(per_call)} runs; "
        f"{min(per_call) * 1000:.3f}–{max(per_call) * 1000:.3f}), so a ceiling of ~{ceiling:,.0f} req/s: "
        f"{ceiling / max(rates):.1f} x the fastest client's median rate ({max(rates):,.0f} req/s)"
    )


def _round_order(clients: Sequence[str], round_no: int) -> list[str]:
    """The fast clients first, then the peers; each group's order rotates every round."""
    fast = [c for c in clients if c in FAST]
    slow = [c for c in clients if c not in FAST]
    order = []
    for group in (fast, slow):
        if group:
            shift = round_no % len(group)
            order += [*group[shift:], *group[:shift]]
    return order


def _progress(record: dict[str, Any]) -> str:
    if record.get("status") != "ok":
        return f"{record.get('status')}: {record.get('detail', '')}"
    rate = record["n"] / record["seconds"]
    blocked = f", BLOCKED network: {record['blocked_network']}" if record.get("blocked_network") else ""
    return f"{rate:,.0f} req/s, {record['cpu_seconds']:.2f} CPU s, {record['errors']} errors{blocked}"


def _summary(runs: dict[str, list[dict[str, Any]]], clients: Sequence[str]) -> list[dict[str, Any]]:
    """One row per client: medians over its rounds, and its ratio to raw aiohttp."""
    raw_done = [r for r in runs.get("raw-aiohttp", []) if r["status"] == "ok"]
    raw_by_round = {r["round"]: r["n"] / r["seconds"] for r in raw_done}
    raw_cpu_by_round = {r["round"]: r["cpu_seconds"] / r["n"] for r in raw_done}
    rows = []
    for client in clients:
        done = [r for r in runs.get(client, []) if r.get("status") == "ok"]
        row: dict[str, Any] = {"client": client, "rounds": len(done)}
        if not done:
            statuses = {r.get("status") for r in runs.get(client, [])}
            row["status"] = "not installed" if statuses == {"not installed"} else "failed"
            row["detail"] = next((r.get("detail") for r in runs.get(client, []) if r.get("detail")), None)
            rows.append(row)
            continue
        rates = [r["n"] / r["seconds"] for r in done]
        ratios = [r["n"] / r["seconds"] / raw_by_round[r["round"]] for r in done if r["round"] in raw_by_round]
        row.update(
            status="ok",
            rates=rates,
            rate=median(rates),
            cpu_per_1000=median([r["cpu_seconds"] / r["n"] * 1000 for r in done]),
            errors=sum(r["errors"] for r in done),
            calls=sum(r["n"] for r in done),
            ratio=median(ratios),
            ratios=ratios,
            cpu_ratio=median(
                [raw_cpu_by_round[r["round"]] / (r["cpu_seconds"] / r["n"]) for r in done if r["round"] in raw_by_round]
            ),
            samples=[s for r in done for s in r.get("samples", [])][:3],
            blocked=[b for r in done for b in r.get("blocked_network", [])],
        )
        rows.append(row)
    return rows


def _table(rows: list[dict[str, Any]], imports: dict[str, float | None]) -> str:
    lines = []
    for row in rows:
        label = LABELS[row["client"]]
        module = "sluice" if row["client"].startswith("sluice") else row["client"]
        seconds = imports.get(module)
        imported = f"{seconds:.2f}" if seconds is not None else "-"
        if row["status"] != "ok":
            lines.append([label, row["status"], "-", "-", "-", "-", "-", imported])
            continue
        spread = f"{min(row['rates']):,.0f}–{max(row['rates']):,.0f}"
        ratio = f"{row['ratio']:.2f}" if row["ratio"] is not None else "-"
        cpu_ratio = f"{row['cpu_ratio']:.2f}" if row["cpu_ratio"] is not None else "-"
        errors = f"{row['errors']} / {row['calls']:,}"
        lines.append(
            [label, f"{row['rate']:,.0f}", spread, f"{row['cpu_per_1000']:.2f}", errors, ratio, cpu_ratio, imported]
        )
    headers = [
        "client",
        "req/s (median)",
        "req/s (min–max)",
        "client CPU s / 1,000 calls",
        "errors / calls",
        "x raw aiohttp",
        "x raw (CPU per call)",
        "import s",
    ]
    return markdown_table(headers, lines, right=(1, 2, 3, 4, 5, 6, 7))


def _imports(args: argparse.Namespace, clients: Sequence[str]) -> tuple[dict[str, float | None], list[list[str]]]:
    _, client_cpus = cpu_plan()
    by_client: dict[str, float | None] = {}
    for client in clients:
        module = "sluice" if client.startswith("sluice") else client
        if module not in by_client and module in IMPORTS and module_available(REQUIRES[client]):
            by_client[module] = import_seconds(IMPORTS[module], repeats=args.import_repeats, cpus=client_cpus)
    details = []
    for label, statement in IMPORT_DETAILS:
        seconds = import_seconds(statement, repeats=args.import_repeats, cpus=client_cpus)
        details.append([f"`{label}`", f"{seconds:.3f}" if seconds is not None else "failed"])
    return by_client, details


def _profile(args: argparse.Namespace, top: int) -> None:
    """Run raw aiohttp and sluice once each under cProfile; print where sluice's extra time goes."""
    server_cpus, client_cpus = cpu_plan()
    profiles: dict[str, tuple[pstats.Stats, dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as folder:
        server = _server_for(args, server_cpus)
        try:
            server.start()
            for client in ("raw-aiohttp", "sluice"):
                out = str(Path(folder) / f"{client}.prof")
                worker_args = [*_worker_args(args, client, server.openai_url), "--profile-out", out]
                outcome = run_worker(SCRIPT, worker_args, timeout=args.timeout, cpus=client_cpus)
                if outcome.result is None or not Path(out).exists():
                    print(f"profiling {client} failed: {outcome.error}\n{outcome.stderr_tail}")
                    return
                profiles[client] = (pstats.Stats(out), outcome.result)
        finally:
            server.stop()
    print_profile(profiles, top)


def _area(filename: str) -> str:
    """Where a function lives, coarsely: a sluice module, or a library."""
    path = filename.replace("\\", "/")
    if "/sluice/" in path:
        return "sluice/" + path.rsplit("/sluice/", 1)[1]
    for name in ("aiohttp", "yarl", "multidict", "asyncio", "json"):
        if f"/{name}/" in path:
            return name
    if path.startswith("~") or path == "<built-in>":
        return "builtins (C)"
    return "other: " + path.rsplit("/", 1)[-1]


def _own_by_area(stats: pstats.Stats) -> dict[str, float]:
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    by_area: dict[str, float] = defaultdict(float)
    for (filename, _, _), entry in raw.items():
        by_area[_area(filename)] += entry[2]
    return by_area


def print_profile(profiles: dict[str, tuple[pstats.Stats, dict[str, Any]]], top: int) -> None:
    """Own time per area for both clients (per 1,000 calls), then sluice's own functions."""
    raw_stats, raw_result = profiles["raw-aiohttp"]
    ours_stats, ours_result = profiles["sluice"]
    per_k_raw = 1000 / raw_result["n"]
    per_k_ours = 1000 / ours_result["n"]
    raw_areas, our_areas = _own_by_area(raw_stats), _own_by_area(ours_stats)
    total_raw = sum(raw_areas.values()) * per_k_raw
    total_ours = sum(our_areas.values()) * per_k_ours
    print(
        f"\n### cProfile: raw aiohttp vs sluice Engine.map ({ours_result['n']:,} calls each; "
        "cProfile inflates every Python call, so compare the columns, not the absolute figures)\n"
    )
    lines = []
    for area in sorted(set(raw_areas) | set(our_areas), key=lambda a: -our_areas.get(a, 0.0))[:top]:
        a = raw_areas.get(area, 0.0) * per_k_raw
        b = our_areas.get(area, 0.0) * per_k_ours
        lines.append([area, f"{a:.3f}", f"{b:.3f}", f"{b - a:+.3f}", f"{b / total_ours:.1%}"])
    lines.append(["total", f"{total_raw:.3f}", f"{total_ours:.3f}", f"{total_ours - total_raw:+.3f}", "100%"])
    headers = ["area (own time)", "raw s / 1,000", "sluice s / 1,000", "difference", "sluice share"]
    print(markdown_table(headers, lines, right=(1, 2, 3, 4)))

    raw: dict[Any, Any] = ours_stats.stats  # type: ignore[attr-defined]
    total = sum(entry[2] for entry in raw.values()) or 1.0
    ours = [(k, v) for k, v in raw.items() if "/sluice/" in k[0].replace("\\", "/")]
    print("\nsluice's own functions by own time (share of the sluice client's total):\n")
    lines = [
        [f"{_area(f)}:{ln} {n}", f"{v[1]:,}", f"{v[2] * per_k_ours:.3f}", f"{v[2] / total:.1%}"]
        for (f, ln, n), v in sorted(ours, key=lambda kv: -kv[1][2])[:top]
    ]
    print(markdown_table(["function", "calls", "own s / 1,000", "share"], lines, right=(1, 2, 3)))
    print("\nsluice's functions by cumulative time (including what they call):\n")
    lines = [
        [f"{_area(f)}:{ln} {n}", f"{v[1]:,}", f"{v[3] * per_k_ours:.3f}", f"{v[3] / total:.1%}"]
        for (f, ln, n), v in sorted(ours, key=lambda kv: -kv[1][3])[:top]
    ]
    print(markdown_table(["function", "calls", "cumulative s / 1,000", "share"], lines, right=(1, 2, 3)))


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.serve_minimal:
        asyncio.run(_serve_minimal())
        return 0
    if args.worker:
        return worker(args)
    clients = [c.strip() for c in args.clients.split(",") if c.strip()]
    unknown = [c for c in clients if c not in CLIENTS]
    if unknown or "raw-aiohttp" not in clients:
        print(f"--clients: choose from {', '.join(CLIENTS)} (raw-aiohttp is required)", file=sys.stderr)
        return 2
    _, client_cpus = cpu_plan()
    pin_self(client_cpus)
    started = time.strftime("%Y-%m-%d %H:%M")
    versions = versions_line()  # before the runs: the code measured
    runs = _rounds(args, clients)
    rows = _summary(runs, clients)
    imports, import_details = _imports(args, clients) if args.import_repeats else ({}, [])
    print(f"\n## Throughput — {started}; {machine_line()}\n\n{versions}.\n")
    print(
        f"Zero-latency {args.server} server in its own process; {args.n:,} calls per run, concurrency "
        f"{args.concurrency}, "
        + (
            "timed from before the client's library is imported, no warm-up (--cold); "
            if args.cold
            else f"{args.warmup} warm-up calls first; "
        )
        + f"{args.rounds} interleaved rounds, "
        "median shown. x raw aiohttp: median of the per-round req/s ratios; x raw (CPU per call): "
        "median of the per-round ratios of raw aiohttp's CPU per call to the client's (steadier when "
        "other work shares the machine).\n"
    )
    print(_table(rows, imports))
    sluice_row = next((r for r in rows if r["client"] == "sluice"), None)
    print(f"\ntarget: sluice >= {TARGET_RATIO} x raw aiohttp", end="")
    if sluice_row and sluice_row.get("ratio") is not None:
        verdict = "met" if sluice_row["ratio"] >= TARGET_RATIO else "MISSED"
        ratios = sluice_row["ratios"]
        raw_row = next(r for r in rows if r["client"] == "raw-aiohttp")
        of_medians = sluice_row["rate"] / raw_row["rate"] if raw_row.get("rate") else float("nan")
        print(
            f" — measured {sluice_row['ratio']:.3f} x ({verdict}): median of {len(ratios)} per-round ratios, "
            f"range {min(ratios):.2f}–{max(ratios):.2f}; ratio of the median rates {of_medians:.2f}; "
            f"CPU per call: {sluice_row['cpu_ratio']:.2f} x raw aiohttp's"
        )
    else:
        print(" — not measured")
    line = server_line(runs, rows)
    if line is not None:
        print(f"\n{line}")
    if import_details:
        print(f"\nImport time (fresh interpreter, median of {args.import_repeats}):\n")
        print(markdown_table(["statement", "seconds"], import_details, right=(1,)))
    for row in rows:
        if row.get("samples"):
            print(f"\n{LABELS[row['client']]}: first errors: {row['samples']}")
        if row.get("blocked"):
            print(f"\n{LABELS[row['client']]}: network access refused: {sorted(set(row['blocked']))}")
        if row.get("status") in ("failed", "not installed") and row.get("detail"):
            print(f"\n{LABELS[row['client']]}: {row['status']}: {row['detail']}")
    path = save_results("throughput", {"args": vars(args), "runs": runs, "rows": rows, "imports": imports})
    print(f"\n(raw figures: {path})")
    if args.profile:
        _profile(args, args.profile_top)
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--n", type=int, default=3000, help="timed calls per run (default 3000)")
    add("--concurrency", type=int, default=100, help="calls in flight at once (default 100)")
    add("--rounds", type=int, default=3, help="interleaved rounds; the median is reported (default 3)")
    add("--warmup", type=int, default=200, help="untimed calls before each timed run (default 200)")
    add(
        "--cold",
        action="store_true",
        help="time each run from before its client's library is imported, with no warm-up: a script's first --n calls",
    )
    add("--max-tokens", type=int, default=16, help="max_tokens of every call (default 16)")
    add(
        "--model",
        default="bench",
        help="the model every client asks for: bench (no known price, the default) or a priced one (gpt-4o-mini)",
    )
    add("--clients", default=",".join(CLIENTS), help=f"comma-separated, from {', '.join(CLIENTS)}")
    add("--timeout", type=float, default=300.0, help="seconds before a client's run is killed (default 300)")
    add("--import-repeats", type=int, default=5, help="fresh interpreters per import figure; 0 skips them")
    add(
        "--server",
        choices=["fake", "minimal"],
        default="fake",
        help="fake: python -m sluice.testing (the default); minimal: a canned-answer HTTP server in this "
        "script, ~10 x cheaper per call",
    )
    add("--profile", action="store_true", help="also profile the sluice client with cProfile")
    add("--profile-top", type=int, default=20, help="rows in each profile table (default 20)")
    # Worker mode (internal): one client, one run, a JSON line on stdout.
    add("--worker", action="store_true", help=argparse.SUPPRESS)
    add("--serve-minimal", action="store_true", help=argparse.SUPPRESS)
    add("--client", default="", help=argparse.SUPPRESS)
    add("--url", default="", help=argparse.SUPPRESS)
    add("--profile-out", default="", help=argparse.SUPPRESS)
    return parser


if __name__ == "__main__":
    sys.exit(main())
