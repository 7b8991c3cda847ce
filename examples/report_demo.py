"""A job worth looking at, and its report: ``python examples/report_demo.py [OUT_DIR]``.

Two fake providers on loopback (nothing reaches the internet) serve one model as two
deployments: ``east`` enforces a rate limit (it answers 429s with Retry-After and sends
its limits in ``x-ratelimit-*`` headers, which sluice learns), ``west`` is slower and
fails in a burst of 503s (the router cools it down). 1,500 lines under a budget that
runs out near the end go through ``sluice run``; then ``sluice report --html`` writes
the page, and with ``--screenshot PNG`` headless Chromium (Debian's ``chromium``,
driven by Playwright) takes the picture in the README (``docs/report.png``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from sluice.testing import FakeServer

CONFIG = """
[[deployment]]
model = "openai/gpt-demo"
name = "east"
base_url = "{east}"
api_key_env = "DEMO_KEY"
rpm = 3000
price = {{ input_per_mtok = 2.0, output_per_mtok = 8.0 }}
[[deployment]]
model = "openai/gpt-demo"
name = "west"
base_url = "{west}"
api_key_env = "DEMO_KEY"
price = {{ input_per_mtok = 2.0, output_per_mtok = 8.0 }}

[cooldown]
after_failures = 3
seconds = 3
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", nargs="?", type=Path, help="where the job's files go (default: a temporary folder)")
    parser.add_argument("--lines", type=int, default=1500)
    parser.add_argument("--budget", type=float, default=0.4)
    parser.add_argument("--screenshot", type=Path, help="also take a PNG of the report's top (needs chromium)")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="sluice-report-demo-"))
    out.mkdir(parents=True, exist_ok=True)
    east = FakeServer(api_key="sk-demo", rpm=1200, window=60, latency=0.05, latency_jitter=0.15, seed=1)
    east.fault_rates = {"429": 0.006}  # now and then a 429 with Retry-After: 1 (a pause)
    west = FakeServer(api_key="sk-demo", latency=0.2, latency_jitter=0.4, seed=2, fault_rates={"500": 0.01})
    for fake in (east, west):
        fake.prices = {"gpt-demo": (2.0, 8.0)}
    with east.running_in_thread(), west.running_in_thread():
        west.inject("503", times=12)  # a bad spell at the start: three failures in a row cool it
        (out / "sluice.toml").write_text(CONFIG.format(east=east.url, west=west.url))
        with (out / "prompts.jsonl").open("w") as f:
            for i in range(args.lines):
                words = " ".join(["word"] * (10 + i % 90))
                line = {"messages": [{"role": "user", "content": f"{i}: {words}"}], "max_tokens": 40}
                f.write(json.dumps(line) + "\n")
        env = {**os.environ, "DEMO_KEY": "sk-demo", "NO_COLOR": "1"}
        run = [sys.executable, "-m", "sluice", "run", "prompts.jsonl", "-o", "results.jsonl"]
        run += ["--config", "sluice.toml", "--model", "openai/gpt-demo", "--budget", str(args.budget)]
        subprocess.run([*run, "--concurrency", "24"], cwd=out, env=env, check=False)
    report = [sys.executable, "-m", "sluice", "report", "results.jsonl", "--html", "report.html"]
    subprocess.run(report, cwd=out, env=env, check=True)
    print(out / "report.html")
    if args.screenshot is not None:
        asyncio.run(_screenshot(out / "report.html", args.screenshot.resolve()))
        print(args.screenshot)


TESTS = Path(__file__).resolve().parent.parent / "tests"


async def _screenshot(page_path: Path, png: Path) -> None:
    sys.path.insert(0, str(TESTS))
    from browser import open_page  # the tests' helper: the same flags, nothing fetched

    async with open_page(page_path, width=1280, height=1350, wait_for="body[data-charts]") as seen:
        if seen.console_errors or seen.page_errors or seen.foreign_requests:
            raise SystemExit(f"the page misbehaved: {seen.console_errors} {seen.page_errors} {seen.foreign_requests}")
        await seen.screenshot(png, full_page=False)


if __name__ == "__main__":
    main()
