"""Limits: how close each client gets to the ideal time for N = 3 x the limit, and at what cost.

    python bench/limits.py [--rpm 300] [--tpm 30000] [--window 6]
    python bench/limits.py --scenario router [--rounds 3]   # two deployments of one model

A fake server (``python -m sluice.testing``) enforces an RPM and a TPM limit over a
shortened window (6 s instead of 60, so a run takes ~20 s instead of 3 minutes) with
per-slice enforcement on (the server's default ``--slice 1.0``: the limit is also
enforced evenly, a bucket of ``rpm x slice / window`` requests refilled at
``rpm / window`` per second). Each client sends N requests whose token cost (prompt
estimate + ``max_tokens``) makes the TPM limit bind at the same rate as the RPM one by
default. A fresh server serves each client, so every client starts from an empty window
and the 429s counted (``GET /_fake/stats``) are its own.

Ideal time: the first request may go at t = 0, then one every ``interval`` seconds::

    interval = max(window / rpm, tokens_per_request x window / tpm)
    ideal    = (N - 1) x interval

"achieved / ideal" is ideal / wall time (the achieved rate over the ideal rate); a
client that uses the server's initial burst can exceed 100 %. Target for sluice:
>= 97 % with no 429.

``--scenario router`` runs the router scenarios of ``_router.py`` instead: one model
served by two deployments, each behind its own fake server with these limits, with both
up and with one killed a third of the way through.
(``--rounds`` of them, N = 3 x the combined limit; target: >= 95 % of the combined
ideal rate with no 429).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import _router
from _clients import LABELS, REQUIRES, NotInstalledError, Settings, make_client
from _common import (
    FakeServerProcess,
    cpu_plan,
    machine_line,
    markdown_table,
    module_available,
    pin_self,
    run_worker,
    save_results,
    versions_line,
    worker_main,
)

SCRIPT = Path(__file__).resolve()
CLIENTS = ("sluice", "raw-aiohttp", "openai", "litellm-router")
TARGET_SHARE = 0.97
#: Prompt token overhead of one user message in the estimate the fake counts with
#: (``sluice._tokens``: 3 to prime the reply + 4 per message), then ~4 characters a token.
MESSAGE_OVERHEAD = 7
_FILLER = "Sluice gates hold water back and let it through at a measured rate. "


def prompt(i: int, prompt_tokens: int) -> str:
    """A distinct prompt of exactly ``prompt_tokens`` estimated tokens (ASCII, 4 characters a token)."""
    length = 4 * (prompt_tokens - MESSAGE_OVERHEAD)
    head = f"Request {i:06d}. "
    body = (_FILLER * (length // len(_FILLER) + 1))[: length - len(head)]
    return head + body


# -- the worker --------------------------------------------------------------------------


async def _measure(args: argparse.Namespace) -> dict[str, Any]:
    settings = Settings(
        url=args.url,
        concurrency=args.concurrency,
        max_tokens=args.max_tokens,
        rpm=args.rpm,
        tpm=args.tpm,
        window=args.window,
        retry_429=True,
        max_attempts=args.raw_max_attempts,
        openai_max_retries=args.openai_max_retries,
        litellm_strategy=args.litellm_strategy or None,
        litellm_num_retries=args.litellm_num_retries,
    )
    try:
        client = make_client(args.client, settings)
    except NotInstalledError as exc:
        return {"status": "not installed", "detail": str(exc)}
    prompts = [prompt(i, args.prompt_tokens) for i in range(args.n)]
    try:
        setup = getattr(client, "setup", None)
        if setup is not None:  # sluice: the engine is started, as `async with Engine(...)` does
            await setup()
        started = time.perf_counter()
        tally = await client.run(prompts)
        seconds = time.perf_counter() - started
    finally:
        await client.aclose()
    return {
        "status": "ok",
        "n": args.n,
        "seconds": seconds,
        "ok": tally.ok,
        "errors": tally.errors,
        "samples": tally.samples,
        "client_retries": tally.retries,
        "client_429s": tally.rate_limited,
    }


def worker(args: argparse.Namespace) -> int:
    return worker_main(_measure, args)


# -- the orchestrator --------------------------------------------------------------------


def _server_args(args: argparse.Namespace) -> list[str]:
    return [
        "--rpm",
        f"{args.rpm:g}",
        "--tpm",
        f"{args.tpm:g}",
        "--window",
        f"{args.window:g}",
        "--slice",
        args.slice,
        "--latency",
        f"{args.latency:g}",
        "--output-tokens",
        str(args.max_tokens),  # so a reply settles to exactly what was reserved
    ]


def _worker_args(args: argparse.Namespace, client: str, url: str) -> list[str]:
    options = {
        "--client": client,
        "--url": url,
        "--n": str(args.n),
        "--concurrency": str(args.concurrency),
        "--max-tokens": str(args.max_tokens),
        "--tokens-per-request": str(args.tokens_per_request),
        "--rpm": f"{args.rpm:g}",
        "--tpm": f"{args.tpm:g}",
        "--window": f"{args.window:g}",
        "--raw-max-attempts": str(args.raw_max_attempts),
        "--openai-max-retries": str(args.openai_max_retries),
        "--litellm-strategy": args.litellm_strategy,
    }
    if args.litellm_num_retries is not None:
        options["--litellm-num-retries"] = str(args.litellm_num_retries)
    return [part for pair in options.items() for part in pair]


def _run_client(args: argparse.Namespace, client: str, timeout: float) -> dict[str, Any]:
    """One client against a fresh server; the record, with the server's counters."""
    if not module_available(REQUIRES[client]):
        return {"client": client, "status": "not installed"}
    server_cpus, client_cpus = cpu_plan()
    server = FakeServerProcess(_server_args(args), cpus=server_cpus)
    try:
        server.start()
        outcome = run_worker(SCRIPT, _worker_args(args, client, server.openai_url), timeout=timeout, cpus=client_cpus)
        stats = server.stats()
    finally:
        server.stop()
    record: dict[str, Any] = dict(outcome.result or {})
    record.setdefault("status", "timeout" if outcome.timed_out else "failed")
    record.update(client=client, server=stats, worker_seconds=outcome.elapsed)
    if outcome.result is None:
        record["detail"] = outcome.error
        record["stderr"] = outcome.stderr_tail
    return record


def _row(record: dict[str, Any], args: argparse.Namespace, ideal: float) -> list[str]:
    label = LABELS[record["client"]]
    if record["status"] == "not installed":
        return [label, "not installed", "-", "-", "-", "-", "-"]
    stats = record["server"]
    served = stats["accepted"]
    rejected = stats["rate_limited"]
    retries = stats["received"] - stats["distinct_keys"]
    if record["status"] != "ok":
        # Killed at the timeout: what the server had answered by then.
        return [
            label,
            f"> {record['worker_seconds']:.1f} ({record['status']})",
            "-",
            str(rejected),
            str(retries),
            f"no: {served} / {args.n} served",
            record.get("detail") or "",
        ]
    seconds = record["seconds"]
    finished = "yes" if record["ok"] == args.n else f"no: {record['ok']} / {args.n}"
    errors = f"{record['errors']} failed" if record["errors"] else ""
    return [
        label,
        f"{seconds:.1f}",
        _share_cell(record, args, ideal),
        str(rejected),
        str(retries),
        finished,
        errors,
    ]


def achieved_share(record: dict[str, Any], args: argparse.Namespace, ideal: float) -> float:
    """Achieved rate over the ideal rate, counting only the requests that succeeded:
    ideal / wall when all N finished; (ok - 1) x interval / wall otherwise."""
    interval = ideal / (args.n - 1)
    return float(max(record["ok"] - 1, 0) * interval / record["seconds"])


def _share_cell(record: dict[str, Any], args: argparse.Namespace, ideal: float) -> str:
    share = f"{achieved_share(record, args, ideal):.1%}"
    return share if record["ok"] == args.n else f"{share} (of the {record['ok']} that succeeded)"


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    deployments = 2 if args.scenario == "router" else 1
    args.n = args.n or int(3 * args.rpm * deployments)  # 3 x the (combined) limit
    args.tokens_per_request = args.tokens_per_request or round(args.tpm / args.rpm)
    args.prompt_tokens = args.tokens_per_request - args.max_tokens
    if args.prompt_tokens < MESSAGE_OVERHEAD + 4:
        print("--tokens-per-request must exceed --max-tokens by at least 11", file=sys.stderr)
        return 2
    router = deployments == 2
    if args.worker:
        if router:
            prompts = [prompt(i, args.prompt_tokens) for i in range(_router.plan_for(args).n)]
            return worker_main(lambda a: _router.measure(a, prompts), args)
        return worker(args)
    choices = _router.ROUTER_CLIENTS if router else CLIENTS
    clients = [c.strip() for c in (args.clients or ",".join(choices)).split(",") if c.strip()]
    unknown = [c for c in clients if c not in choices]
    if unknown:
        print(f"--clients: choose from {', '.join(choices)}", file=sys.stderr)
        return 2
    _, client_cpus = cpu_plan()
    pin_self(client_cpus)
    if router:
        if args.rounds < 1:
            print("--rounds must be at least 1", file=sys.stderr)
            return 2
        return _router.run(args, script=SCRIPT, server_args=_server_args(args), clients=clients)

    request_interval = args.window / args.rpm
    token_interval = args.tokens_per_request * args.window / args.tpm
    interval = max(request_interval, token_interval)
    ideal = (args.n - 1) * interval
    if abs(request_interval - token_interval) <= 1e-9 * interval:
        binding = "both (RPM and TPM bind at the same rate)"
    elif request_interval > token_interval:
        binding = "RPM"
    else:
        binding = "TPM"
    timeout = args.timeout or max(60.0, 4 * ideal)
    started = time.strftime("%Y-%m-%d %H:%M")
    versions = versions_line()  # before the runs: the code measured

    records = []
    for client in clients:
        record = _run_client(args, client, timeout)
        records.append(record)
        print(f"{client}: {record.get('status')} {_brief(record)}", file=sys.stderr)

    print(f"\n## Limits — {started}; {machine_line()}\n\n{versions}.\n")
    print(
        f"Fake server: rpm={args.rpm:g}, tpm={args.tpm:g} per {args.window:g} s window, slice={args.slice} s, "
        f"latency {args.latency:g} s; a fresh server per client. N = {args.n:,} requests of "
        f"{args.prompt_tokens} prompt + {args.max_tokens} max_tokens = {args.tokens_per_request} tokens each; "
        f"concurrency {args.concurrency}; each run killed after {timeout:g} s.\n"
        f"Binding limit: {binding}. ideal = (N - 1) x max(window / rpm, tokens x window / tpm) "
        f"= {args.n - 1} x {interval:g} s = {ideal:.2f} s.\n"
    )
    headers = [
        "client",
        "wall s",
        "achieved / ideal rate",
        "429s (server)",
        "retries (server)",
        "all N finished",
        "notes",
    ]
    print(markdown_table(headers, [_row(r, args, ideal) for r in records], right=(1, 2, 3, 4)))
    print(
        "\n429s: rate-limit rejections the server sent. retries: requests the server received beyond one "
        "per distinct request body. LiteLLM counts its rpm/tpm per minute, so it is given "
        f"rpm={int(args.rpm * 60 / args.window)}, tpm={int(args.tpm * 60 / args.window)} per 60 s "
        f"(the same rate); routing_strategy={args.litellm_strategy or 'default'}."
    )
    sluice = next((r for r in records if r["client"] == "sluice" and r["status"] == "ok"), None)
    print(f"\ntarget: sluice >= {TARGET_SHARE:.0%} of the ideal rate with no 429", end="")
    if sluice is not None:
        share = achieved_share(sluice, args, ideal)
        rejected = sluice["server"]["rate_limited"]
        verdict = "met" if share >= TARGET_SHARE and rejected == 0 and sluice["ok"] == args.n else "MISSED"
        print(f" — measured {share:.1%}, {rejected} 429s ({verdict})")
    else:
        print(" — not measured")
    for record in records:
        tokens = _tokens_per_request(record)
        if tokens is not None and tokens != args.tokens_per_request:
            print(f"\nnote: the server counted {tokens:g} tokens per request from {LABELS[record['client']]}")
        if record.get("samples"):
            print(f"\n{LABELS[record['client']]}: first errors: {record['samples']}")
        if record.get("blocked_network"):
            print(f"\n{LABELS[record['client']]}: network access refused: {sorted(set(record['blocked_network']))}")
    payload = {"args": vars(args), "ideal": ideal, "binding": binding, "records": records}
    print(f"\n(raw figures: {save_results('limits', payload)})")
    return 0


def _tokens_per_request(record: dict[str, Any]) -> float | None:
    stats = record.get("server")
    if not stats or not stats.get("accepted"):
        return None
    return float(stats["prompt_tokens"] + stats["completion_tokens"]) / stats["accepted"]


def _brief(record: dict[str, Any]) -> str:
    stats = record.get("server") or {}
    if record.get("status") != "ok":
        return f"{record.get('detail', '')} (server: {stats.get('accepted')} served, {stats.get('rate_limited')} 429s)"
    return (
        f"{record['seconds']:.1f} s, {record['ok']} ok, {record['errors']} errors, "
        f"{stats.get('rate_limited')} 429s, {stats.get('received')} received"
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--rpm", type=float, default=300, help="requests per window (default 300)")
    add("--tpm", type=float, default=30000, help="tokens per window (default 30000)")
    add("--window", type=float, default=6.0, help="limit window in seconds (default 6)")
    add("--slice", default="1.0", help="server's even-slicing seconds, or none (default 1.0)")
    add("--latency", type=float, default=0.05, help="server latency per answer, seconds (default 0.05)")
    add("--n", type=int, default=0, help="requests per client (default 3 x rpm; router: 3 x the combined rpm)")
    add("--concurrency", type=int, default=100, help="requests in flight per client (default 100)")
    add("--max-tokens", type=int, default=16, help="max_tokens of every request (default 16)")
    add(
        "--tokens-per-request",
        type=int,
        default=0,
        help="prompt estimate + max_tokens per request (default tpm / rpm: both limits bind together)",
    )
    add(
        "--scenario",
        choices=("single", "router"),
        default="single",
        help="single: one deployment per client (the default); router: two deployments of one model, "
        "both up and one dying mid-run (see _router.py)",
    )
    add(
        "--clients",
        default="",
        help=f"comma-separated, from {', '.join(CLIENTS)} (router: {', '.join(_router.ROUTER_CLIENTS)}); default all",
    )
    add("--timeout", type=float, default=0.0, help="seconds before a client's run is killed (default 4 x ideal)")
    add("--raw-max-attempts", type=int, default=10, help="raw aiohttp: attempts per request (default 10)")
    add("--openai-max-retries", type=int, default=2, help="openai SDK max_retries (default 2, the SDK's)")
    add(
        "--litellm-strategy",
        default="usage-based-routing-v2",
        help="LiteLLM Router routing_strategy, the one that enforces rpm/tpm (default usage-based-routing-v2)",
    )
    add("--litellm-num-retries", type=int, default=None, help="LiteLLM Router num_retries (default: LiteLLM's)")
    _router.add_arguments(add)
    add("--worker", action="store_true", help=argparse.SUPPRESS)
    add("--client", default="", help=argparse.SUPPRESS)
    add("--url", default="", help=argparse.SUPPRESS)
    return parser


if __name__ == "__main__":
    sys.exit(main())
