"""Run the fake provider in its own process: ``python -m sluice.testing --port 0``.

It prints ``listening on http://HOST:PORT`` once it accepts connections and serves until
SIGINT or SIGTERM, so a benchmark can measure a client without sharing its CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import signal
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from ._faults import Fault
from ._prompt_cache import PromptCacheSettings
from ._server import FakeServer
from ._structured import INVALID_KINDS


def _optional_float(text: str) -> float | None:
    return None if text.lower() in ("none", "off", "0") else float(text)


def _fault_rate(text: str) -> tuple[str, float]:
    kind, _, rate = text.partition("=")
    try:
        return Fault(kind).value, float(rate)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected KIND=PROBABILITY, got {text!r}") from None


def _price(text: str) -> tuple[str, tuple[float, ...]]:
    model, _, prices = text.partition("=")
    try:
        rates = tuple(float(part) for part in prices.split(","))
    except ValueError:
        rates = ()
    if len(rates) not in (2, 4):
        raise argparse.ArgumentTypeError(f"expected MODEL=IN,OUT or MODEL=IN,OUT,CACHE_READ,CACHE_WRITE, got {text!r}")
    return model, rates


def _minimum(text: str) -> tuple[str, int]:
    model, _, number = text.rpartition("=")
    try:
        return model or "*", int(number)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected [MODEL=]TOKENS, got {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m sluice.testing", description="Fake OpenAI/Anthropic server.")
    add = parser.add_argument
    add("--host", default="127.0.0.1")
    add("--port", type=int, default=8765, help="0 picks a free port (default 8765)")
    add("--rpm", type=float, default=None, help="requests per window (default: unlimited)")
    add("--tpm", type=float, default=None, help="tokens per window (default: unlimited)")
    add("--itpm", type=float, default=None, help="input tokens per window, a token bucket (default: unlimited)")
    add("--otpm", type=float, default=None, help="output tokens per window, a token bucket (default: unlimited)")
    add("--window", type=float, default=60.0, help="window in seconds (default 60)")
    add("--slice", type=_optional_float, default=1.0, help="even-slicing seconds, or none")
    add("--jitter", type=float, default=0.02, help="slice tolerance in seconds")
    add("--latency", type=float, default=0.0, help="seconds before each answer")
    add("--latency-jitter", type=float, default=0.0, help="extra random latency, seconds")
    add("--output-tokens", type=int, default=16, help="completion tokens per answer")
    add("--api-key", default=None, help="require this key")
    add("--seed", type=int, default=None, help="seed for random faults and latency")
    add("--fault-rate", type=_fault_rate, action="append", default=[], metavar="KIND=P")
    add(
        "--price",
        type=_price,
        action="append",
        default=[],
        metavar="MODEL=IN,OUT[,READ,WRITE]",
        help="USD per million tokens: input, output and optionally cache reads and writes",
    )
    add("--no-retry-after", action="store_true", help="omit retry-after on 429s")
    add(
        "--tokenizer",
        choices=["chars", "bytes"],
        default="chars",
        help="how prompts are counted: ~4 characters a token, or one token per UTF-8 byte (hostile)",
    )
    add("--batch-start-after", type=float, default=0.0, help="seconds a batch waits before it starts (inf: never)")
    add("--batch-lines-per-second", type=float, default=None, help="batch lines answered a second (default: at once)")
    add("--batch-expire-after", type=float, default=24 * 3600.0, help="seconds until a batch expires")
    add("--flex-refusal-rate", type=float, default=0.0, help="share of flex requests refused: 429 resource unavailable")
    _add_prompt_cache(add)
    add("--invalid-rate", type=float, default=0.0, help="share of JSON-schema answers given invalid (0-1)")
    add("--invalid-first", type=int, default=0, help="the first N asks of each prompt get an invalid JSON answer")
    add(
        "--invalid-kinds",
        type=lambda text: [k.strip() for k in text.split(",") if k.strip()],
        default=None,
        help=f"comma-separated kinds of invalid answer, of {','.join(INVALID_KINDS)} (default: all)",
    )
    return parser


def _add_prompt_cache(add: Callable[..., Any]) -> None:
    """The prompt-cache flags (see ``sluice.testing._prompt_cache``)."""
    add(
        "--prompt-cache",
        choices=["auto", "on", "off"],
        default="auto",
        help="cache prompts as the providers do: auto (requests with breakpoints or a prompt_cache_key), "
        "on (also every OpenAI prompt), off",
    )
    add("--cache-ttl", type=float, default=300.0, help="seconds an OpenAI cache entry lives unused (default 300)")
    add("--cache-ttl-5m", type=float, default=300.0, help="seconds an Anthropic 5-minute entry lives (default 300)")
    add("--cache-ttl-1h", type=float, default=3600.0, help="seconds an Anthropic 1-hour entry lives (default 3600)")
    add("--cache-overflow-rpm", type=float, default=15.0, help="OpenAI requests a minute per prefix and key (15)")
    add("--cache-spill-machines", type=int, default=64, help="OpenAI machines an overflowing request lands on")
    add(
        "--cache-min-tokens",
        type=_minimum,
        action="append",
        default=[],
        metavar="[MODEL=]TOKENS",
        help="the fewest tokens a cached prefix may have, for a model (prefix) or all",
    )


def _cache_settings(args: argparse.Namespace) -> PromptCacheSettings:
    return PromptCacheSettings(
        mode=args.prompt_cache,
        ttl=args.cache_ttl,
        ttl_5m=args.cache_ttl_5m,
        ttl_1h=args.cache_ttl_1h,
        overflow_rpm=args.cache_overflow_rpm,
        spill_machines=args.cache_spill_machines,
        minimums=dict(args.cache_min_tokens),
    )


def build_server(args: argparse.Namespace) -> FakeServer:
    server = FakeServer(
        rpm=args.rpm,
        tpm=args.tpm,
        itpm=args.itpm,
        otpm=args.otpm,
        window=args.window,
        slice=args.slice,
        jitter=args.jitter,
        latency=args.latency,
        latency_jitter=args.latency_jitter,
        output_tokens=args.output_tokens,
        api_key=args.api_key,
        fault_rates=dict(args.fault_rate),
        seed=args.seed,
        send_retry_after=not args.no_retry_after,
        prices=dict(args.price),
        tokenizer=args.tokenizer,
        prompt_cache=_cache_settings(args),
        host=args.host,
        port=args.port,
    )
    server.batches.start_after = args.batch_start_after
    server.batches.lines_per_second = args.batch_lines_per_second
    server.batches.expire_after = args.batch_expire_after
    server.flex_refusal_rate = args.flex_refusal_rate
    server.structured.configure(rate=args.invalid_rate, first=args.invalid_first, kinds=args.invalid_kinds)
    return server


async def _serve(server: FakeServer) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    async with server:
        print(f"listening on {server.anthropic_url}", flush=True)
        await stop.wait()


def _runner() -> Callable[[Coroutine[Any, Any, None]], None]:
    """uvloop's ``run`` when it is installed (it is optional), else asyncio's."""
    with contextlib.suppress(ImportError):
        run: Callable[[Coroutine[Any, Any, None]], None] = importlib.import_module("uvloop").run
        return run
    return asyncio.run


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the options, serve until a signal arrives, exit 0."""
    args = build_parser().parse_args(argv)
    try:
        server = build_server(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    _runner()(_serve(server))
    return 0


if __name__ == "__main__":
    sys.exit(main())
