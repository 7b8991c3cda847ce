"""The prompt-cache planner on the document-QA job: the bill and the time, with and without it.

    python bench/prompt_cache.py            # ~5 min on 2 cores (the ITPM-bound job is slow uncached)

The job (``tests/cachejobs.py``): 240 lines, one ~1,200-token instruction set, 30
documents of ~1,500 tokens, 8 questions each, shuffled, nothing marked. Each run gets a
fresh fake provider (``python -m sluice.testing``, its own process and core) that caches
and bills as the providers document (Anthropic: breakpoints, 0.1x reads, 1.25x writes;
OpenAI: every prompt, ``--prompt-cache on``, routed by its first tokens and key, ~15 a
minute per route). Clients: ``sluice run --prompt-cache off``, ``sluice run`` (auto), and
LiteLLM's ``acompletion`` with ``cache_control_injection_points`` at the system message
(its fixed-point marking; the documents are in the user message, which it cannot split),
under a semaphore of the same concurrency, with its own retries (``num_retries=8``). The third job is the
first 80 lines (10 documents) on an Anthropic deployment limited to 20,000 input tokens
per 10 s: cache reads do not count against it. The batch job is the 240 lines through
the fake's Message Batches (``--tier batch``; LiteLLM has no batch tier to compare), which
read what earlier lines of a batch wrote. Everything runs offline (``OFFLINE_ENV``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _common import RESULT_MARK, FakeServerProcess, cpu_plan, machine_line, markdown_table, worker_env

CONCURRENCY = 64
JOBS: dict[str, dict[str, Any]] = {
    "anthropic-qa": {
        "title": "Anthropic document QA (240 lines)",
        "model": "anthropic/claude-sonnet-4-5",
        "fake": ["--price", "claude-sonnet-4-5=3,15", "--latency", "0.5"],
        "documents": 30,
    },
    "openai-qa": {
        "title": "OpenAI document QA (240 lines)",
        "model": "openai/gpt-4o-mini",
        "fake": ["--price", "gpt-4o-mini=0.15,0.6", "--latency", "0.5", "--prompt-cache", "on"],
        "documents": 30,
    },
    "anthropic-qa-batch": {
        "title": "Anthropic document QA on --tier batch (240 lines)",
        "model": "anthropic/claude-sonnet-4-5",
        "fake": ["--price", "claude-sonnet-4-5=3,15", "--latency", "0.5", "--batch-start-after", "0"],
        "documents": 30,
        "tier": ["--tier", "batch", "--poll-every", "0.5"],
    },
    "anthropic-itpm": {
        "title": "Anthropic, 20,000 ITPM per 10 s (80 lines)",
        "model": "anthropic/claude-sonnet-4-5",
        "fake": ["--price", "claude-sonnet-4-5=3,15", "--latency", "1", "--itpm", "20000", "--window", "10"],
        "documents": 10,
        "limits": {"itpm": 20000, "window": 10},
    },
}


def _write_job(folder: Path, model: str, documents: int) -> Path:
    from cachejobs import document_qa

    source = folder / "in.jsonl"
    lines = document_qa(model.partition("/")[2], documents=documents)
    source.write_text("".join(json.dumps({k: v for k, v in line.items() if k != "model"}) + "\n" for line in lines))
    return source


def _config(folder: Path, model: str, url: str, limits: dict[str, Any]) -> Path:
    base = url if model.startswith("anthropic/") else f"{url}/v1"
    lines = ["[[deployment]]", f'model = "{model}"', f'base_url = "{base}"', 'api_key_env = "BENCH_KEY"']
    lines += [f"{name} = {value}" for name, value in limits.items()]
    path = folder / "sluice.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _run_client(
    client: str, job: dict[str, Any], folder: Path, server: FakeServerProcess, cpus: Any
) -> tuple[float, int]:
    """(seconds the client took, lines it got an answer for)."""
    model, source = job["model"], folder / "in.jsonl"
    env = {**worker_env(), "BENCH_KEY": "x", "NO_COLOR": "1"}
    if client == "litellm":
        command = [sys.executable, __file__, "--worker", "--url", server.url, "--model", model, "--input", str(source)]
    else:
        config = _config(folder, model, server.url, job.get("limits", {}))
        output = folder / f"out-{client}.jsonl"
        mode = "off" if client == "sluice-off" else "auto"
        command = [sys.executable, "-m", "sluice", "run", str(source), "-o", str(output), "--config", str(config)]
        command += ["--model", model, "--concurrency", str(CONCURRENCY), "--prompt-cache", mode, "--log-every", "60"]
        command += job.get("tier", [])
    began = time.monotonic()
    done = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=900, preexec_fn=lambda: _pin(cpus), check=False
    )
    took = time.monotonic() - began
    if done.returncode not in (0, 1):  # 1: some lines failed (counted below)
        raise SystemExit(f"{client} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    lines = len((folder / "in.jsonl").read_text().splitlines())
    if client == "litellm":
        result = next(line for line in done.stdout.splitlines() if line.startswith(RESULT_MARK))
        return took, lines - int(json.loads(result[len(RESULT_MARK) :])["errors"])
    records = [json.loads(line) for line in output.read_text().splitlines()]
    return took, sum(1 for record in records if record.get("error") is None)


def _pin(cpus: Any) -> None:
    if cpus is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus)


def _estimate(folder: Path, model: str, tier: str) -> float | None:
    command = [sys.executable, "-m", "sluice", "estimate", str(folder / "in.jsonl"), "--model", model, "--json"]
    command += ["--tier", tier]
    done = subprocess.run(command, env=worker_env(), capture_output=True, text=True, timeout=300, check=True)
    cost = json.loads(done.stdout)["cost_usd"]
    return float(cost) if cost is not None else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", default=",".join(JOBS), help="comma-separated, of: " + ", ".join(JOBS))
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--input", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        asyncio.run(_litellm(args.url, args.model, Path(args.input)))
        return
    server_cpus, client_cpus = cpu_plan()
    rows = []
    for name in [n for n in JOBS if n in args.jobs.split(",")]:
        job = JOBS[name]
        tier = "batch" if "tier" in job else "sync"
        for client in ("sluice-off", "sluice") if tier == "batch" else ("sluice-off", "sluice", "litellm"):
            with tempfile.TemporaryDirectory(prefix="sluice-cache-bench-") as tmp:
                folder = Path(tmp)
                _write_job(folder, job["model"], job["documents"])
                with FakeServerProcess(job["fake"], cpus=server_cpus) as server:
                    took, answered = _run_client(client, job, folder, server, client_cpus)
                    stats = server.stats()
                estimate = _estimate(folder, job["model"], tier) if client == "sluice" else None
            cache = stats["prompt_cache"]
            prompt = stats["prompt_tokens"] or 1
            label = {"sluice-off": "sluice --prompt-cache off", "sluice": "sluice (planner)"}.get(
                client, "LiteLLM cache_control_injection_points"
            )
            if client == "litellm" and job["model"].startswith("openai/"):
                label = "LiteLLM (no injection: OpenAI caches by itself)"
            rows.append(
                [
                    job["title"],
                    label,
                    f"${stats['total_billed_usd']:.4f}",
                    "-" if estimate is None else f"${estimate:.4f}",
                    f"{cache['read_tokens'] / prompt:.0%}",
                    f"{cache['duplicate_writes']}",
                    f"{stats['rate_limited']}",
                    f"{answered}",
                    f"{took:.1f} s",
                ]
            )
            print(" | ".join(rows[-1]), file=sys.stderr)
    print(machine_line())
    header = [
        "job",
        "client",
        "billed",
        "estimate --json",
        "read from cache",
        "duplicate writes",
        "429s",
        "answered",
        "time",
    ]
    print(markdown_table(header, rows))


async def _litellm(url: str, model: str, source: Path) -> None:
    """LiteLLM on the job: ``acompletion`` under a semaphore, marking the system message."""
    from _common import forbid_network

    forbid_network()
    import litellm

    lines = [json.loads(line) for line in source.read_text().splitlines()]  # noqa: ASYNC240 - before any request
    gate = asyncio.Semaphore(CONCURRENCY)
    anthropic = model.startswith("anthropic/")
    extra: dict[str, Any] = {"api_base": url if anthropic else f"{url}/v1", "api_key": "x", "num_retries": 8}
    if anthropic:
        extra["cache_control_injection_points"] = [{"location": "message", "role": "system"}]

    async def one(line: dict[str, Any]) -> bool:
        async with gate:
            try:
                await litellm.acompletion(
                    model=model, messages=line["messages"], max_tokens=line["max_tokens"], **extra
                )
            except Exception:
                return False
            return True

    done = await asyncio.gather(*(one(line) for line in lines))
    print(RESULT_MARK + json.dumps({"errors": done.count(False)}))


if __name__ == "__main__":
    main()
