"""Make ``docs/dashboard.png``: a real ``sluice serve`` dashboard, in headless Chromium.

    python docs/dashboard_png.py [OUT.png]

Two fake providers on loopback (one that answers 503s now and then, so it cools down;
neither says its limits in the config, so sluice learns them from the headers), three
clients at work (a notebook, an agent, an evaluation's Batch API job), for about half a
minute; then the page is photographed. Needs the test extra (playwright) and Chromium.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import random
import shutil
import sys
import tempfile
from pathlib import Path

import openai

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from browser_dash import browse
from servetools import listening

from sluice import Deployment, Price, RetryPolicy
from sluice.cli._config import JobConfig
from sluice.serve._app import build_app
from sluice.serve.core._settings import ClientSpec, ServeSettings
from sluice.testing import FakeServer

ADMIN = "sk-admin-demo-0123456789"
KEYS = {
    "NOTEBOOK_KEY": "sk-notebook-0123456789ab",
    "AGENT_KEY": "sk-agent-0123456789abcd",
    "EVAL_KEY": "sk-eval-0123456789abcde",
}
MODEL = "openai/gpt-4o-mini"


async def chat(client: openai.AsyncOpenAI, text: str, stop: asyncio.Event, pause: float) -> None:
    i = 0
    while not stop.is_set():
        with contextlib.suppress(openai.APIError):
            await client.chat.completions.create(
                model="gpt-4o-mini", messages=[{"role": "user", "content": f"{text} {i}"}], max_tokens=64
            )
        i += 1
        await asyncio.sleep(pause * random.uniform(0.5, 1.5))


async def main(out: Path) -> None:
    prices = {"*": (0.15, 0.60)}
    async with (
        FakeServer(api_key="sk-up", rpm=900, latency=0.25, latency_jitter=0.2, output_tokens=48, prices=prices) as east,
        FakeServer(api_key="sk-up", rpm=600, latency=0.4, latency_jitter=0.3, output_tokens=48, prices=prices) as west,
        browse() as browser,
    ):
        price = Price(0.15, 0.60)
        deployments = (
            Deployment(MODEL, name="east", base_url=east.url, api_key="sk-up", price=price),
            Deployment(MODEL, name="west", base_url=west.url, api_key="sk-up", price=price, weight=0.5),
        )
        clients = (
            ClientSpec("notebook", "NOTEBOOK_KEY", budget_usd=2.0, rpm=120),
            ClientSpec("agent", "AGENT_KEY", budget_usd=0.05, models=(MODEL,)),
            ClientSpec("eval-pipeline", "EVAL_KEY", budget_usd=20.0),
        )
        config = JobConfig(deployments, retry=RetryPolicy(max_attempts=4), budget_usd=50.0)
        env = {**KEYS, "ADMIN_KEY": ADMIN}
        state = Path(tempfile.mkdtemp(prefix="sluice-dashboard-"))
        app = build_app(config, ServeSettings(admin_key_env="ADMIN_KEY"), clients, state, environ=env)
        async with listening(app) as url:
            sdk = {
                name: openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0) for name, key in KEYS.items()
            }
            lines = "".join(
                json.dumps({"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions",
                            "body": {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": f"grade {i}"}],
                                     "max_tokens": 64}}) + "\n"
                for i in range(3000)
            )  # fmt: skip
            evals = sdk["EVAL_KEY"]
            uploaded = await evals.files.create(file=("grades.jsonl", io.BytesIO(lines.encode())), purpose="batch")
            await evals.batches.create(
                input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
            stop = asyncio.Event()
            workers = [
                asyncio.create_task(chat(sdk["NOTEBOOK_KEY"], "explain", stop, 0.3)),
                asyncio.create_task(chat(sdk["NOTEBOOK_KEY"], "summarise", stop, 0.4)),
                asyncio.create_task(chat(sdk["AGENT_KEY"], "plan step", stop, 0.2)),
            ]
            visit = await browser.visit(
                url + "/dashboard", headers={"authorization": f"Bearer {ADMIN}"}, viewport=(1200, 900)
            )
            for second in range(36):
                if second in (8, 9, 24, 25, 26, 27):
                    west.inject("503", times=3)
                if second == 30:
                    west.inject("503", times=12)
                await asyncio.sleep(1)
            await visit.wait_for("Number(document.getElementById('updated').dataset.polls) >= 10")
            await asyncio.sleep(2.5)
            await visit.screenshot(out, full_page=True)
            stop.set()
            await asyncio.gather(*workers)
            for client in sdk.values():
                await client.close()
        shutil.rmtree(state, ignore_errors=True)
        size = await asyncio.to_thread(lambda: out.stat().st_size)
        print(f"wrote {out} ({size // 1024} KB); console errors: {visit.console_errors or 'none'}")


if __name__ == "__main__":
    target = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent / "dashboard.png").resolve()
    asyncio.run(main(target))
