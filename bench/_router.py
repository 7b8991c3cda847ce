"""Router scenarios for ``limits.py``: one model served by two deployments, "east" and
"west", each behind a fake server of its own with the same strict limits.

``shared``: N = 3 x the combined limit. The ideal spreads N evenly over both servers,
each sending one request every ``interval`` from t = 0::

    ideal = (ceil(N / 2) - 1) x interval

``death``: the same, but the west server is killed (SIGKILL by PID, so its port refuses
connections) a third of the way through, at ``t_kill = ideal_shared / 3``. The ideal is
both servers at full rate until then (``m = floor(t_kill / interval) + 1`` requests
each), then east alone at its rate for the rest::

    ideal = (N - m - 1) x interval

The worker kills the server itself, so the moment is the same in every client's run
(measured from the start of its timer, after its setup), and fetches the west server's
counters just before. Requests sent to the dead server are counted in the worker as
TCP connection attempts to its port after the kill (an audit hook on
``socket.connect``): with keep-alive a live server sees few connects, but every
attempt at a dead port is one connect, whatever the client's HTTP stack.

Clients, each over both servers:

- sluice: ``Engine([Deployment(..., name="east", rpm, tpm, window), Deployment(...,
  name="west", ...)])`` and ``engine.map``; the default ``sluice.Cooldown()`` (3
  consecutive failures, 5 s doubling to 300 s, one probe when it ends).
- LiteLLM's Router: two ``model_list`` entries with one ``model_name``, ``rpm``/``tpm``
  in ``litellm_params`` and ``routing_strategy="usage-based-routing-v2"``, the strategy
  that "picks the deployment with the lowest tpm this minute that stays under its tpm
  and rpm" (docs.litellm.ai/docs/router/learn/strategies; the load-balancing guide says
  to set ``rpm`` "if you want to maximize throughput",
  docs.litellm.ai/docs/proxy/load_balancing). Its retries and cooldowns are left at
  LiteLLM's defaults (docs.litellm.ai/docs/router/learn/reliability): ``num_retries`` 2;
  in a group of several deployments one 429, or more than half of a minute's (>= 5)
  requests failing, cools a deployment down for 5 s (``_should_cooldown_deployment`` in
  ``litellm/router_utils/cooldown_handlers.py``, ``DEFAULT_COOLDOWN_TIME_SECONDS``).
- raw aiohttp, round-robin: no limiter; every attempt goes to the next server in turn;
  a 429 sleeps its ``retry-after`` then goes on to the next server, a connection error
  goes on at once; up to ``--raw-max-attempts`` attempts. The floor for 429s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import itertools
import json
import math
import os
import signal
import statistics
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import (
    FakeServerProcess,
    cpu_plan,
    machine_line,
    markdown_table,
    module_available,
    run_worker,
    save_results,
    versions_line,
)

__all__ = ["ROUTER_CLIENTS", "add_arguments", "measure", "run"]

ROUTER_CLIENTS = ("sluice", "litellm-router", "raw-aiohttp")
REQUIRES = {"sluice": "sluice", "litellm-router": "litellm", "raw-aiohttp": "aiohttp"}
LABELS = {
    "sluice": "sluice Engine.map, 2 deployments",
    "litellm-router": "LiteLLM Router, 2 deployments",
    "raw-aiohttp": "raw aiohttp round-robin, no limiter",
}
SCENARIOS = ("shared", "death")
NAMES = ("east", "west")
MODEL_NAME = "bench"
PROVIDER_MODEL = f"openai/{MODEL_NAME}"
TARGET_SHARE = 0.95
#: When the west server dies, as a share of the shared scenario's ideal time.
KILL_FRACTION = 1 / 3


# -- the ideal ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Plan:
    """N, one deployment's interval between requests, and when west dies."""

    n: int
    interval: float
    kill_at: float

    @property
    def sent_before_kill(self) -> int:
        """Requests each deployment sends in the ideal schedule up to the kill."""
        return math.floor(self.kill_at / self.interval + 1e-9) + 1

    def ideal(self, scenario: str, done: int | None = None) -> float:
        """Ideal seconds to finish ``done`` requests (default N)."""
        done = self.n if done is None else done
        if done <= 1:
            return 0.0
        shared = (math.ceil(done / 2) - 1) * self.interval
        if scenario == "shared":
            return shared
        m = self.sent_before_kill
        if done <= 2 * m:
            return shared
        return (done - m - 1) * self.interval


def plan_for(args: argparse.Namespace) -> Plan:
    interval = max(args.window / args.rpm, args.tokens_per_request * args.window / args.tpm)
    n = args.n
    shared_ideal = (math.ceil(n / 2) - 1) * interval
    return Plan(n=n, interval=interval, kill_at=KILL_FRACTION * shared_ideal)


# -- the worker ---------------------------------------------------------------------------


class ConnectCounter:
    """TCP connection attempts per port, with times relative to :meth:`mark` (an audit hook)."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.by_port: dict[int, list[float]] = {}
        sys.addaudithook(self._hook)

    def mark(self) -> None:
        self.started = time.perf_counter()

    def _hook(self, event: str, args: tuple[Any, ...]) -> None:
        if event == "socket.connect":
            address = args[1]
            if isinstance(address, tuple) and len(address) >= 2:
                self.by_port.setdefault(int(address[1]), []).append(time.perf_counter() - self.started)

    def after(self, port: int, moment: float) -> int:
        return sum(1 for t in self.by_port.get(port, ()) if t >= moment)


@dataclass
class Tally:
    ok: int = 0
    errors: int = 0
    samples: list[str] = field(default_factory=list)
    by_deployment: Counter[str] = field(default_factory=Counter)
    error_kinds: Counter[str] = field(default_factory=Counter)
    extra: dict[str, Any] = field(default_factory=dict)

    def fail(self, what: object) -> None:
        self.errors += 1
        self.error_kinds[_kind(what)] += 1
        if len(self.samples) < 3:
            text = what if isinstance(what, str) else f"{type(what).__name__}: {what}"
            self.samples.append(text[:300])


def _kind(what: object) -> str:
    """A short name for a failure, to count them by kind."""
    if isinstance(what, str):
        return what.split(":", 1)[0]
    kind = getattr(what, "kind", None)  # a sluice error
    name = f"{type(what).__name__}{f' ({kind})' if isinstance(kind, str) else ''}"
    if "No deployments available" in str(what):  # LiteLLM: every deployment cooling down or over its limit
        name += " (no deployments available)"
    return name


class SluiceRouter:
    def __init__(self, args: argparse.Namespace, urls: Sequence[str]) -> None:
        import sluice

        self.sluice = sluice
        self.max_tokens = args.max_tokens
        deployments = [
            sluice.Deployment(
                PROVIDER_MODEL,
                name=name,
                base_url=url,
                api_key="x",
                rpm=args.rpm,
                tpm=args.tpm,
                window=args.window,
            )
            for name, url in zip(NAMES, urls, strict=True)
        ]
        #: What each retry was for (a 429's message says which limit), at most 20.
        self.retry_events: list[dict[str, Any]] = []
        self.engine = sluice.Engine(deployments, concurrency=args.concurrency, on_retry=self._retried)

    def _retried(self, event: Any) -> None:
        if len(self.retry_events) < 20:
            self.retry_events.append(
                {
                    "t": time.perf_counter(),
                    "deployment": event.deployment,
                    "error": f"{event.error.kind}: {event.error.message[:160]}",
                }
            )

    async def setup(self) -> None:
        await self.engine.start()

    def status(self) -> list[dict[str, Any]]:
        return [
            {
                "deployment": s.deployment,
                "state": s.describe(),
                "in_flight": s.in_flight,
                "answered": s.answered,
                "failed": s.failed,
            }
            for s in self.engine.deployment_status()
        ]

    async def run(self, prompts: Sequence[str], tally: Tally) -> None:
        sluice, engine = self.sluice, self.engine
        requests = (sluice.Request.from_prompt(PROVIDER_MODEL, p, max_tokens=self.max_tokens) for p in prompts)
        async for result in engine.map(requests):
            if result.ok:
                tally.ok += 1
                tally.by_deployment[result.deployment or "?"] += 1
            else:
                tally.fail(result.error)
        tally.extra.update(
            retries=engine.stats.retries,
            rate_limited=engine.stats.rate_limited,
            status_at_end=self.status(),
            retry_events=self.retry_events,
        )

    async def aclose(self) -> None:
        await self.engine.close()


class LiteLLMRouter:
    def __init__(self, args: argparse.Namespace, urls: Sequence[str]) -> None:
        from litellm import Router

        per_minute = 60.0 / args.window  # LiteLLM counts per minute: the same rate
        self.max_tokens = args.max_tokens
        self.concurrency = args.concurrency
        self.urls = list(urls)
        model_list = [
            {
                "model_name": MODEL_NAME,
                "litellm_params": {
                    "model": PROVIDER_MODEL,
                    "api_base": url,
                    "api_key": "x",
                    "rpm": int(args.rpm * per_minute),
                    "tpm": int(args.tpm * per_minute),
                },
            }
            for url in urls
        ]
        options: dict[str, Any] = {}
        if args.litellm_strategy:
            options["routing_strategy"] = args.litellm_strategy
        if args.litellm_num_retries is not None:
            options["num_retries"] = args.litellm_num_retries
        self.router = Router(model_list=model_list, **options)

    async def run(self, prompts: Sequence[str], tally: Tally) -> None:
        semaphore = asyncio.Semaphore(self.concurrency)
        names = dict(zip(self.urls, NAMES, strict=True))

        async def one(prompt: str) -> None:
            async with semaphore:
                try:
                    reply: Any = await self.router.acompletion(
                        model=MODEL_NAME, messages=[{"role": "user", "content": prompt}], max_tokens=self.max_tokens
                    )
                except Exception as exc:
                    tally.fail(exc)
                    return
            if isinstance(reply.choices[0].message.content, str):
                tally.ok += 1
                base = (getattr(reply, "_hidden_params", None) or {}).get("api_base") or "?"
                tally.by_deployment[names.get(str(base).rstrip("/"), str(base))] += 1
            else:
                tally.fail("no text in the reply")

        await asyncio.gather(*(one(p) for p in prompts))

    async def aclose(self) -> None:
        return None


class RawRoundRobin:
    def __init__(self, args: argparse.Namespace, urls: Sequence[str]) -> None:
        import aiohttp

        self.aiohttp = aiohttp
        self.max_tokens = args.max_tokens
        self.concurrency = args.concurrency
        self.max_attempts = args.raw_max_attempts
        self.targets = [(name, f"{url}/chat/completions") for name, url in zip(NAMES, urls, strict=True)]
        self.session = aiohttp.ClientSession()

    async def run(self, prompts: Sequence[str], tally: Tally) -> None:
        session, headers = self.session, {"Authorization": "Bearer x"}
        semaphore = asyncio.Semaphore(self.concurrency)
        turn = itertools.cycle(self.targets)
        attempts: Counter[str] = Counter()

        async def one(prompt: str) -> None:
            body = {
                "model": MODEL_NAME,
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": self.max_tokens,
            }
            async with semaphore:
                last: object = "no attempt"
                for attempt in range(1, self.max_attempts + 1):
                    name, url = next(turn)
                    attempts[name] += 1
                    try:
                        async with session.post(url, json=body, headers=headers) as response:
                            data = await response.read()
                            status = response.status
                            retry_after = response.headers.get("retry-after")
                    except (self.aiohttp.ClientError, OSError) as exc:
                        last = exc
                        continue  # the other server, at once
                    if status == 200:
                        if isinstance(json.loads(data)["choices"][0]["message"]["content"], str):
                            tally.ok += 1
                            tally.by_deployment[name] += 1
                        else:
                            tally.fail("no text in the reply")
                        return
                    last = f"HTTP {status}: {data[:200]!r}"
                    if status != 429:
                        break
                    if attempt < self.max_attempts:
                        await asyncio.sleep(float(retry_after or 1.0))
                tally.fail(last)

        await asyncio.gather(*(one(p) for p in prompts))
        tally.extra["attempts"] = dict(attempts)

    async def aclose(self) -> None:
        await self.session.close()


_BUILDERS: dict[str, Callable[[argparse.Namespace, Sequence[str]], Any]] = {
    "sluice": SluiceRouter,
    "litellm-router": LiteLLMRouter,
    "raw-aiohttp": RawRoundRobin,
}


def _fetch_stats(base_url: str) -> dict[str, Any]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"{base_url.removesuffix('/v1')}/_fake/stats", timeout=10) as response:
        data: dict[str, Any] = json.loads(response.read())
    return data


async def measure(args: argparse.Namespace, prompts: Sequence[str]) -> dict[str, Any]:
    """One client's run over both servers (in the worker process); west dies if told to."""
    counter = ConnectCounter()
    urls = args.urls.split(",")
    west_port = int(urls[1].rsplit(":", 1)[1].split("/")[0])
    try:
        client = _BUILDERS[args.client](args, urls)
    except Exception as exc:  # a peer that fails to import is "not installed", whatever the reason
        return {"status": "not installed", "detail": f"{type(exc).__name__}: {exc}"}
    tally = Tally()
    death: dict[str, Any] = {}

    async def kill_west() -> None:
        await asyncio.sleep(args.kill_at)
        death["west_stats"] = await asyncio.to_thread(_fetch_stats, urls[1])
        if isinstance(client, SluiceRouter):
            death["sluice_status"] = client.status()
        os.kill(args.kill_pid, signal.SIGKILL)
        death["at"] = time.perf_counter() - counter.started

    try:
        setup = getattr(client, "setup", None)
        if setup is not None:  # sluice: what `async with Engine(...)` does before the first request
            await setup()
        counter.mark()
        killer = asyncio.create_task(kill_west()) if args.kill_pid else None
        started, cpu = time.perf_counter(), time.process_time()
        try:
            await client.run(prompts, tally)
            seconds = time.perf_counter() - started
            cpu = time.process_time() - cpu
        finally:
            if killer is not None and not killer.done():
                killer.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await killer
    finally:
        await client.aclose()
    for event in tally.extra.get("retry_events", ()):
        event["t"] = round(event["t"] - counter.started, 4)  # seconds into the run
    record: dict[str, Any] = {
        "status": "ok",
        "n": len(prompts),
        "seconds": seconds,
        "cpu_seconds": cpu,
        "ok": tally.ok,
        "errors": tally.errors,
        "samples": tally.samples,
        "error_kinds": dict(tally.error_kinds),
        "answered_by": dict(tally.by_deployment),
        "connects": {str(port): len(times) for port, times in counter.by_port.items()},
        **tally.extra,
    }
    if death:
        record["death"] = death
        record["connects_to_dead"] = counter.after(west_port, death["at"])
    elif args.kill_pid:
        record["death"] = {"at": None, "note": "the run ended before the kill"}
    return record


def add_arguments(add: Callable[..., Any]) -> None:
    """The router scenarios' own options (and the worker's hidden ones)."""
    add("--rounds", type=int, default=3, help="router scenarios: interleaved rounds (default 3)")
    add("--urls", default="", help=argparse.SUPPRESS)
    add("--kill-pid", type=int, default=0, help=argparse.SUPPRESS)
    add("--kill-at", type=float, default=0.0, help=argparse.SUPPRESS)


# -- the orchestrator -------------------------------------------------------------------


def _worker_args(
    args: argparse.Namespace, client: str, urls: Sequence[str], kill: tuple[int, float] | None
) -> list[str]:
    options = {
        "--scenario": "router",
        "--client": client,
        "--urls": ",".join(urls),
        "--n": str(args.n),
        "--concurrency": str(args.concurrency),
        "--max-tokens": str(args.max_tokens),
        "--tokens-per-request": str(args.tokens_per_request),
        "--rpm": f"{args.rpm:g}",
        "--tpm": f"{args.tpm:g}",
        "--window": f"{args.window:g}",
        "--raw-max-attempts": str(args.raw_max_attempts),
        "--litellm-strategy": args.litellm_strategy,
    }
    if args.litellm_num_retries is not None:
        options["--litellm-num-retries"] = str(args.litellm_num_retries)
    if kill is not None:
        options["--kill-pid"] = str(kill[0])
        options["--kill-at"] = f"{kill[1]:.6f}"
    return [part for pair in options.items() for part in pair]


def _run_once(
    args: argparse.Namespace, script: Path, server_args: Sequence[str], client: str, scenario: str, plan: Plan
) -> dict[str, Any]:
    """One client, one scenario, on two fresh servers; the record with both servers' counters."""
    server_cpus, client_cpus = cpu_plan()
    servers = [FakeServerProcess(server_args, cpus=server_cpus) for _ in NAMES]
    timeout = args.timeout or max(60.0, 4 * plan.ideal(scenario))
    try:
        for server in servers:
            server.start()
        west_pid = servers[1].pid
        assert west_pid is not None
        kill = (west_pid, plan.kill_at) if scenario == "death" else None
        urls = [s.openai_url for s in servers]
        outcome = run_worker(script, _worker_args(args, client, urls, kill), timeout=timeout, cpus=client_cpus)
        stats = {}
        for name, server in zip(NAMES, servers, strict=True):
            with contextlib.suppress(OSError):  # the dead one answers nothing
                stats[name] = server.stats()
    finally:
        for server in servers:
            server.stop()
    record: dict[str, Any] = dict(outcome.result or {})
    record.setdefault("status", "timeout" if outcome.timed_out else "failed")
    if record["status"] == "ok" and "death" in record and "west_stats" in record["death"]:
        stats.setdefault("west", record["death"]["west_stats"])  # its counters just before it died
    record.update(client=client, scenario=scenario, server=stats, worker_seconds=outcome.elapsed)
    if outcome.result is None:
        record["detail"] = outcome.error
        record["stderr"] = outcome.stderr_tail
    return record


def _metrics(record: dict[str, Any], plan: Plan) -> dict[str, float]:
    """The figures a table cell summarises over rounds."""
    stats = record["server"]
    east, west = stats.get("east", {}), stats.get("west", {})
    ideal = plan.ideal(record["scenario"], record["ok"])
    out = {
        "seconds": record["seconds"],
        "cpu": record.get("cpu_seconds", math.nan),
        "share": ideal / record["seconds"] if record["seconds"] > 0 else 0.0,
        "failed": float(record["n"] - record["ok"]),
        "served_east": float(east.get("accepted", 0)),
        "served_west": float(west.get("accepted", 0)),
        "429_east": float(east.get("rate_limited", 0)),
        "429_west": float(west.get("rate_limited", 0)),
        "retries": float(sum(s.get("received", 0) - s.get("distinct_keys", 0) for s in (east, west))),
    }
    if record["scenario"] == "death":
        out["to_dead"] = float(record.get("connects_to_dead", 0))
        death = record.get("death") or {}
        out["killed_at"] = float(death.get("at") or math.nan)
    return out


def _cell(values: Sequence[float], fmt: str) -> str:
    if not values:
        return "-"
    mid = statistics.median(values)
    low, high = min(values), max(values)
    if len(values) == 1 or format(low, fmt) == format(high, fmt):
        return format(mid, fmt)
    return f"{format(mid, fmt)} ({format(low, fmt)}–{format(high, fmt)})"


def _pair(a: Sequence[float], b: Sequence[float]) -> str:
    return f"{_cell(a, ',.0f')} / {_cell(b, ',.0f')}"


_HEADERS = {
    "shared": (
        "client",
        "wall s",
        "client CPU s",
        "achieved / ideal rate",
        "served east / west",
        "429s east / west",
        "retries (server)",
        "failed",
    ),
    "death": (
        "client",
        "wall s",
        "client CPU s",
        "achieved / ideal rate",
        "failed",
        "sent to west after it died",
        "served east / west",
        "429s east / west",
        "retries (server)",
    ),
}


def _table(scenario: str, records: list[dict[str, Any]], clients: Sequence[str], plan: Plan) -> str:
    rows = []
    for client in clients:
        mine = [r for r in records if r["client"] == client]
        label = LABELS[client]
        if any(r["status"] == "not installed" for r in mine):
            rows.append([label, "not installed", *["-"] * (len(_HEADERS[scenario]) - 2)])
            continue
        good = [_metrics(r, plan) for r in mine if r["status"] == "ok"]
        bad = [r for r in mine if r["status"] != "ok"]

        def col(key: str, rows: list[dict[str, float]] = good) -> list[float]:
            return [m[key] for m in rows]

        wall = _cell(col("seconds"), ".1f")
        cpu = _cell(col("cpu"), ".1f")
        if bad:
            wall += f"; {len(bad)} run(s) {bad[0]['status']}"
        if scenario == "shared":
            rows.append(
                [
                    label,
                    wall,
                    cpu,
                    _cell([100 * v for v in col("share")], ".1f") + " %",
                    _pair(col("served_east"), col("served_west")),
                    _pair(col("429_east"), col("429_west")),
                    _cell(col("retries"), ",.0f"),
                    _cell(col("failed"), ",.0f"),
                ]
            )
        else:
            rows.append(
                [
                    label,
                    wall,
                    cpu,
                    _cell([100 * v for v in col("share")], ".1f") + " %",
                    _cell(col("failed"), ",.0f"),
                    _cell(col("to_dead"), ",.0f"),
                    _pair(col("served_east"), col("served_west")),
                    _pair(col("429_east"), col("429_west")),
                    _cell(col("retries"), ",.0f"),
                ]
            )
    headers = _HEADERS[scenario]
    return markdown_table(headers, rows, right=tuple(range(1, len(headers))))


def _brief(record: dict[str, Any]) -> str:
    if record.get("status") != "ok":
        return f"{record.get('status')}: {record.get('detail', '')}"
    stats = record["server"]
    parts = [
        f"{record['seconds']:.1f} s",
        f"{record['ok']} ok",
        f"{record['errors']} errors",
        "served " + "/".join(str(stats.get(n, {}).get("accepted", "?")) for n in NAMES),
        "429s " + "/".join(str(stats.get(n, {}).get("rate_limited", "?")) for n in NAMES),
    ]
    if "connects_to_dead" in record:
        parts.append(f"killed at {record['death'].get('at', 0):.2f} s, {record['connects_to_dead']} sent to it after")
    return ", ".join(parts)


def run(args: argparse.Namespace, *, script: Path, server_args: Sequence[str], clients: Sequence[str]) -> int:
    """Both router scenarios, ``--rounds`` interleaved rounds; print the tables."""
    plan = plan_for(args)
    started = time.strftime("%Y-%m-%d %H:%M")
    versions = versions_line()
    available = [c for c in clients if module_available(REQUIRES[c])]
    records: list[dict[str, Any]] = [
        {"client": c, "scenario": s, "status": "not installed"}
        for c in clients
        if c not in available
        for s in SCENARIOS
    ]
    for round_no in range(args.rounds):
        order = available[round_no % len(available) :] + available[: round_no % len(available)] if available else []
        for scenario in SCENARIOS:
            for client in order:
                record = _run_once(args, script, server_args, client, scenario, plan)
                record["round"] = round_no + 1
                records.append(record)
                print(f"round {round_no + 1} {scenario} {client}: {_brief(record)}", file=sys.stderr)

    shared_ideal, death_ideal = plan.ideal("shared"), plan.ideal("death")
    print(f"\n## Router — {started}; {machine_line()}\n\n{versions}.\n")
    print(
        f"Two fake servers (east, west), each rpm={args.rpm:g}, tpm={args.tpm:g} per {args.window:g} s window, "
        f"slice={args.slice} s, latency {args.latency:g} s; two fresh servers per run. N = {plan.n:,} requests "
        f"(3 x the combined limit) of {args.tokens_per_request} tokens each; concurrency {args.concurrency}; "
        f"{args.rounds} round(s), clients interleaved; each cell is the median (min–max) over rounds.\n"
    )
    print(
        f"### Shared: both deployments up\n\nideal = (ceil(N / 2) - 1) x {plan.interval:g} s = {shared_ideal:.2f} s "
        "(each server at its limit from t = 0).\n"
    )
    print(_table("shared", [r for r in records if r["scenario"] == "shared"], clients, plan))
    print(
        f"\n### Death: west is killed (SIGKILL) at t = {plan.kill_at:.2f} s, a third of the way through\n\n"
        f"ideal = both at their limit until then ({plan.sent_before_kill} requests each), east alone after: "
        f"(N - {plan.sent_before_kill} - 1) x {plan.interval:g} s = {death_ideal:.2f} s.\n"
    )
    print(_table("death", [r for r in records if r["scenario"] == "death"], clients, plan))
    print(
        "\nclient CPU s: the client process's CPU time during the run (one core). "
        "achieved / ideal rate: the ideal time for the requests that succeeded over the wall time. "
        "served and 429s: the servers' own counters (west's, in the death runs, read just before it was "
        "killed). retries: requests the servers received beyond one per distinct request. sent to west "
        "after it died: TCP connection attempts to its port after the kill, counted in the client's process. "
        f"LiteLLM is given rpm={int(args.rpm * 60 / args.window)}, tpm={int(args.tpm * 60 / args.window)} "
        f"per 60 s per deployment (the same rate), routing_strategy={args.litellm_strategy or 'default'}."
    )
    shared = [
        _metrics(r, plan)
        for r in records
        if r["client"] == "sluice" and r["scenario"] == "shared" and r["status"] == "ok"
    ]
    print(f"\ntarget: sluice >= {TARGET_SHARE:.0%} of the combined ideal rate with no 429", end="")
    if shared:
        share = statistics.median(m["share"] for m in shared)
        rejected = max(m["429_east"] + m["429_west"] for m in shared)
        failed = max(m["failed"] for m in shared)
        verdict = "met" if share >= TARGET_SHARE and rejected == 0 and failed == 0 else "MISSED"
        print(f" — measured {share:.1%} (median), at most {rejected:g} 429s in a run ({verdict})")
    else:
        print(" — not measured")
    deaths = {}
    for record in records:
        if record["scenario"] == "death" and record.get("status") == "ok":
            at = (record.get("death") or {}).get("at")
            deaths.setdefault(record["client"], []).append(at if at is not None else math.nan)
    if deaths:
        moments = "; ".join(f"{LABELS[c]} {', '.join(f'{t:.2f}' for t in ts)} s" for c, ts in deaths.items())
        print(f"\nwest was killed at (the worker's event loop fires the kill; a busy loop fires it late): {moments}.")
    for record in records:
        if record["client"] == "sluice" and record.get("retry_events"):
            limited = [e for e in record["retry_events"] if e["error"].startswith("rate_limited")]
            if limited:
                print(f"\nsluice ({record['scenario']}, round {record.get('round')}) 429s: {limited}")
    for record in records:
        if record.get("error_kinds"):
            kinds = ", ".join(f"{n} {k}" for k, n in sorted(record["error_kinds"].items(), key=lambda kv: -kv[1]))
            print(f"\n{LABELS[record['client']]} ({record['scenario']}, round {record.get('round')}): failed: {kinds}")
        if record.get("blocked_network"):
            print(f"\n{LABELS[record['client']]}: network access refused: {sorted(set(record['blocked_network']))}")
    payload = {"args": vars(args), "plan": dataclasses.asdict(plan), "records": records}
    print(f"\n(raw figures: {save_results('limits_router', payload)})")
    return 0
