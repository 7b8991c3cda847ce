"""An agent firing several calls at once under one budget, on the simulated provider.

python examples/agent.py
"""

import asyncio

import sluice


async def main() -> None:
    model = "simulate/demo"
    deployment = sluice.Deployment(
        model,
        rpm=600,
        price=sluice.Price(input_per_mtok=2.5, output_per_mtok=10.0),  # pretend it costs like a big model
        options={"latency": 0.3},
    )
    async with sluice.Engine([deployment], budget_usd=0.05) as engine:
        async with engine.session(budget_usd=0.01, name="install helper") as task:
            packages = ["requests", "numpy", "rich", "click", "aiohttp"]
            answers = await asyncio.gather(
                *(task.complete(model, f"What does the package {p} do? One line.", max_tokens=100) for p in packages)
            )
            for package, answer in zip(packages, answers, strict=True):
                print(f"{package:10} {answer.text if answer.ok else answer.error}  (${answer.cost_usd or 0:.5f})")
            print(f"task: ${task.spent():.5f} spent, ${task.remaining():.5f} left")
        print(f"engine: ${engine.spent():.5f} spent of $0.05; stats {engine.stats.snapshot()['succeeded']} ok")


asyncio.run(main())
