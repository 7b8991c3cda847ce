"""The ``sluice`` command: a thin layer over the library.

``sluice run`` streams a file of prompts through the engine (resumable, never paying
twice), ``sluice estimate`` says what a run would take without sending anything,
``sluice report`` summarises a past or running job from its state file, and
``sluice config check`` validates ``sluice.toml`` and prints it with keys masked.
"""

from __future__ import annotations

import asyncio
import functools
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from .._errors import SluiceError
from .._models import Price
from ..batch._inputs import InputOptions, Template
from ._config import JobConfig, describe, load_config, with_overrides

__all__ = ["main"]

F = TypeVar("F", bound=Callable[..., Any])


def _fail(message: str, code: int = 2) -> None:
    click.echo(f"sluice: error: {message}", err=True)
    sys.exit(code)


def _friendly(fn: F) -> F:
    """Turn a SluiceError anywhere below into one clear line and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except SluiceError as exc:
            _fail(exc.message)

    return wrapper  # type: ignore[return-value]


def _config_options(fn: F) -> F:
    options = [
        click.option(
            "--config",
            "config_path",
            type=click.Path(path_type=Path),
            help="TOML config (default: ./sluice.toml if present).",
        ),
        click.option("--model", help="Model for every record, e.g. openai/gpt-4o-mini or simulate/demo."),
        click.option("--rpm", type=click.FloatRange(min=0, min_open=True), help="Requests per window for --model."),
        click.option("--tpm", type=click.FloatRange(min=0, min_open=True), help="Tokens per window for --model."),
        click.option(
            "--max-in-flight",
            type=click.IntRange(min=1),
            help="Requests awaiting an answer at once, for --model.",
        ),
        click.option("--concurrency", type=click.IntRange(min=1), help="Requests admitted at once across deployments."),
        click.option(
            "--price",
            callback=_parse_price,
            help="USD per million tokens for --model: IN,OUT or IN,OUT,CACHED_IN (unlisted or self-hosted).",
        ),
        click.option("--budget", type=click.FloatRange(min=0), help="Never spend more than this many US dollars."),
        click.option("--allow-unpriced", is_flag=True, help="Let a budgeted run use models with no known price."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _parse_price(ctx: click.Context, param: click.Parameter, value: str | None) -> Price | None:
    if value is None:
        return None
    try:
        numbers = [float(part) for part in value.split(",")]
        if len(numbers) not in (2, 3):
            raise ValueError
        return Price(*numbers)
    except (ValueError, SluiceError):
        raise click.BadParameter(
            f"expected IN,OUT or IN,OUT,CACHED_IN dollars per million tokens, got {value!r}"
        ) from None


def _input_options(fn: F) -> F:
    options = [
        click.option(
            "--template",
            help="Build each prompt from a row's fields: 'Explain {name}'. @FILE reads it from a file.",
        ),
        click.option("--system", help="A system prompt added to every request."),
        click.option("--id-field", help="With --template: the field that identifies a row."),
        click.option("--max-tokens", type=click.IntRange(min=1), help="max_tokens for every request."),
        click.option("--temperature", type=click.FloatRange(min=0), help="temperature for every request."),
        click.option(
            "--format",
            "input_format",
            type=click.Choice(["auto", "jsonl", "csv"]),
            default="auto",
            show_default=True,
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


_INPUT_FLAGS = ("template", "system", "id_field", "max_tokens", "temperature", "input_format")


def _job_config(flags: dict[str, Any]) -> JobConfig:
    """The config file with the flags applied; takes the config flags out of ``flags``."""
    return with_overrides(
        load_config(flags.pop("config_path")),
        model=flags["model"],  # left in: it also overrides every record's model
        rpm=flags.pop("rpm"),
        tpm=flags.pop("tpm"),
        max_in_flight=flags.pop("max_in_flight"),
        concurrency=flags.pop("concurrency"),
        price=flags.pop("price"),
        budget_usd=flags.pop("budget"),
        allow_unpriced=flags.pop("allow_unpriced"),
    )


def _input_opts(config: JobConfig, model: str | None, **flags: Any) -> InputOptions:
    template = flags.pop("template")
    if template is not None and template.startswith("@"):
        try:
            template = Path(template[1:]).read_text(encoding="utf-8")
        except OSError as exc:
            _fail(f"--template {template}: {exc.strerror}")
    return InputOptions(
        model=model,
        default_model=config.model,
        template=Template(template) if template is not None else None,
        system=flags["system"],
        id_field=flags["id_field"],
        max_tokens=flags["max_tokens"],
        temperature=flags["temperature"],
        format=flags["input_format"],
    )


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="llm-sluice")
def main() -> None:
    """Run many LLM requests at once, inside the provider's limits, never paying twice."""


@main.command()
@click.argument("input_path", metavar="INPUT", type=click.Path(path_type=Path))
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path),
    required=True,
    help="Results JSONL (appended; one record per input record).",
)
@_config_options
@_input_options
@click.option("--ordered", is_flag=True, help="Write results in input order (default: as they complete).")
@click.option("--state", type=click.Path(path_type=Path), help="SQLite state file (default: OUTPUT with .sluice.db).")
@click.option("--retry-failed", is_flag=True, help="Send again the records that failed at the provider.")
@click.option("--no-cache", is_flag=True, help="Do not serve identical requests from stored answers.")
@click.option("--strict", is_flag=True, help="Stop at the first bad input record instead of recording it.")
@click.option("--restart", is_flag=True, help="Start the output over (stored answers are still reused).")
@click.option(
    "--log-every",
    type=click.FloatRange(min=0.1),
    default=10.0,
    show_default=True,
    help="Seconds between progress lines when not on a terminal.",
)
@_friendly
def run(input_path: Path, output: Path, **flags: Any) -> None:
    """Stream INPUT (JSONL chat bodies, OpenAI Batch API lines, or CSV/JSONL rows with
    --template) through the engine into OUTPUT. Rerun the same command to resume."""
    from ..batch._runner import JobProgress, JobSpec, default_state_path, run_job
    from ._progress import ProgressView, summary_rows

    config = _job_config(flags)
    spec = JobSpec(
        input=input_path,
        output=output,
        state=flags["state"] or default_state_path(output),
        config=config,
        inputs=_input_opts(
            config,
            flags.pop("model"),
            **{k: flags[k] for k in ("template", "system", "id_field", "max_tokens", "temperature", "input_format")},
        ),
        ordered=flags["ordered"],
        retry_failed=flags["retry_failed"],
        cache=not flags["no_cache"],
        strict=flags["strict"],
        restart=flags["restart"],
    )
    progress = JobProgress()
    view = ProgressView(progress, every=flags["log_every"])
    aborted = False

    async def job() -> None:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        presses = 0

        def on_signal() -> None:
            nonlocal presses
            presses += 1
            if presses == 1:
                progress.stop()
                view.tick()
            elif task is not None:
                task.cancel()

        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, on_signal)
        await run_job(spec, progress, view.tick)

    view.start()
    try:
        asyncio.run(job())
    except (KeyboardInterrupt, asyncio.CancelledError):
        aborted = True
    finally:
        view.stop()
    _print_table("sluice run", [*summary_rows(progress), ("output", str(output)), ("state", str(spec.state))])
    if progress.strict_error is not None:
        _fail(f"{progress.strict_error} (--strict: stopped here; fix it and rerun to resume)", 1)
    exhausted = progress.errors.get("budget_exhausted", 0)
    if exhausted:
        click.echo(
            f"sluice: the budget is spent: {exhausted:,} records were not run; "
            "rerun with a larger --budget to resume them",
            err=True,
        )
    if aborted or not progress.complete:
        click.echo("sluice: interrupted; rerun the same command to resume (nothing done is sent again)", err=True)
        sys.exit(130)


@main.command()
@click.argument("input_path", metavar="INPUT", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@_config_options
@_input_options
@click.option("--expected-output", type=click.IntRange(min=0), help="Output tokens you expect per request.")
@_friendly
def estimate(input_path: Path, **flags: Any) -> None:
    """Count INPUT's requests and tokens and the shortest time the limits allow; sends nothing."""
    from ..batch._estimate import estimate_job

    config = _job_config(flags)
    expected_output = flags.pop("expected_output")
    inputs = _input_opts(config, flags.pop("model"), **flags)
    result = estimate_job(input_path, config, inputs, expected_output=expected_output)
    _print_table(f"sluice estimate {input_path}", result.rows())
    for line in result.examples_of_bad:
        click.echo(f"  {line}", err=True)


@main.command()
@click.argument("state", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@_friendly
def report(state: Path) -> None:
    """Summarise the job whose state file is STATE (finished, interrupted or running)."""
    from ..batch._report import report_rows

    _print_table(f"sluice report {state}", report_rows(state))


@main.group()
def config() -> None:
    """Inspect the configuration."""


@config.command("check")
@_config_options
@_friendly
def config_check(**flags: Any) -> None:
    """Validate the config file and print the effective configuration (keys masked)."""
    effective = _job_config(flags)
    source = effective.source or "(no config file; defaults and flags)"
    click.echo(f"config: {source}")
    budget = "-" if effective.budget_usd is None else f"${effective.budget_usd:,.2f}"
    click.echo(f"default model: {effective.model or '-'}   concurrency: {effective.concurrency}   budget: {budget}")
    retry = effective.retry
    click.echo(
        f"retry: {retry.max_attempts} attempts, backoff {retry.base_delay:g}s..{retry.max_delay:g}s, "
        f"deadline {retry.deadline}s, attempt timeout {retry.attempt_timeout}s"
    )
    rows = describe(effective)
    if not rows:
        click.echo("deployments: none (models are served without local limits; they learn from headers)")
    for row in rows:
        _print_table(f"deployment {row.pop('deployment')}", list(row.items()))


def _print_table(title: str, rows: list[tuple[str, str]]) -> None:
    """A rich table on a terminal; plain ``name: value`` lines in logs and pipes."""
    if not sys.stdout.isatty():
        width = max(len(name) for name, _ in rows)
        click.echo(title)
        for name, value in rows:
            click.echo(f"  {name.ljust(width)}  {value}")
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    for name, value in rows:
        table.add_row(name, value)
    Console().print(table)
