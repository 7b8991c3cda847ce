"""The ``sluice`` command: a thin layer over the library.

``sluice run`` streams a file of prompts through the engine (resumable, never paying
twice), ``sluice estimate`` says what a run would take without sending anything,
``sluice report`` summarises a past or running job from its state file, and
``sluice config check`` validates ``sluice.toml`` and prints it with keys masked.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from .._errors import SluiceError
from .._models import Price
from ..batch._inputs import InputOptions, Template
from ..structured import MAX_REASKS
from ._config import JobConfig, describe, describe_defaults, load_config, with_overrides
from ._flags import (
    check_tier_providers,
    distributed_flags,
    duration,
    estimate_tier_option,
    fail,
    prompt_cache_option,
    schema_flag,
    with_tier,
)
from ._otel import otel_option, with_otel
from ._worker import checked_redis_url

__all__ = ["main"]

F = TypeVar("F", bound=Callable[..., Any])


#: The exit status of an unexpected error (EX_SOFTWARE in sysexits.h): never 1, which
#: means "the job finished and some records failed".
EXIT_INTERNAL = 70
#: The exit status when the reader of our output went away (128 + SIGPIPE, as the shell
#: reports a process killed by it).
EXIT_BROKEN_PIPE = 141


def _say_library_warnings() -> None:
    """The library's warnings (Redis away, a hook that raised) as the command's own lines:
    ``sluice: ...`` on stderr, like everything else it says."""
    import logging

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("sluice: %(message)s"))
    logger = logging.getLogger("sluice")
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    logger.propagate = False


def _friendly(fn: F) -> F:
    """Turn a SluiceError anywhere below into one clear line and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except SluiceError as exc:
            fail(exc.message)
        except (click.exceptions.Exit, click.ClickException, SystemExit, KeyboardInterrupt):
            raise
        except BrokenPipeError:  # `sluice report ... | head`: the reader left; not a bug
            # Point stdout at /dev/null so the interpreter's own flush at exit fails no more,
            # and exit as a process stopped by SIGPIPE does (what `yes | head` gives the shell).
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(EXIT_BROKEN_PIPE)
        except Exception as exc:  # a bug: say so plainly, with its own exit status
            traceback.print_exc()
            fail(
                f"internal error ({type(exc).__name__}: {exc}). This is a bug in sluice, not in your input: "
                "please report it with the traceback above. A job can be resumed by rerunning the same command",
                EXIT_INTERNAL,
            )

    return wrapper  # type: ignore[return-value]


def _config_options(fn: F) -> F:
    options = [
        click.option(
            "--config",
            "config_path",
            type=click.Path(path_type=Path),
            help="TOML config (default: ./sluice.toml, once trusted with `sluice config trust`).",
        ),
        click.option(
            "--model",
            help="Model for records that name none, e.g. openai/gpt-4o-mini or simulate/demo.",
        ),
        click.option(
            "--rpm",
            type=click.FloatRange(min=0, min_open=True),
            help="Requests per window: for --model; without it, for each model with no deployment configured.",
        ),
        click.option(
            "--tpm",
            type=click.FloatRange(min=0, min_open=True),
            help="Tokens per window (applied like --rpm).",
        ),
        click.option(
            "--itpm",
            type=click.FloatRange(min=0, min_open=True),
            help="Input tokens per window, apart from output (Anthropic's ITPM; applied like --rpm).",
        ),
        click.option(
            "--otpm",
            type=click.FloatRange(min=0, min_open=True),
            help="Output tokens per window, reserved at max_tokens (Anthropic's OTPM; applied like --rpm).",
        ),
        click.option(
            "--max-in-flight",
            type=click.IntRange(min=1),
            help="Requests awaiting an answer at once (applied like --rpm).",
        ),
        click.option(
            "--burst",
            "burst_requests",
            type=click.FloatRange(min=0),
            metavar="REQUESTS",
            help="Requests allowed at once above the even pace (applied like --rpm).",
        ),
        click.option(
            "--burst-tokens",
            type=click.FloatRange(min=0),
            metavar="TOKENS",
            help="Tokens allowed at once above the even pace (applied like --rpm).",
        ),
        click.option("--concurrency", type=click.IntRange(min=1), help="Requests admitted at once across deployments."),
        click.option(
            "--price",
            callback=_parse_price,
            help="USD per million tokens, IN,OUT or IN,OUT,CACHED_IN (unlisted or self-hosted; applied like --rpm).",
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
        click.option(
            "--force-model",
            is_flag=True,
            help="Send every record to --model, even one that names another model.",
        ),
        click.option("--system", help="A system prompt added to every request."),
        click.option(
            "--embed",
            "embed_field",
            metavar="FIELD",
            help="Embed FIELD of each CSV/JSONL row with --model (an embeddings model): one vector per row.",
        ),
        click.option("--id-field", help="With --template: the field that identifies a row."),
        click.option("--max-tokens", type=click.IntRange(min=1), help="max_tokens for every request."),
        click.option(
            "--temperature",
            type=click.FloatRange(min=0, max=2),
            help="temperature for every request (0 to 2, as OpenAI takes it; Anthropic takes 0 to 1).",
        ),
        click.option(
            "--format",
            "input_format",
            type=click.Choice(["auto", "jsonl", "csv"]),
            default="auto",
            show_default=True,
            help="The input's format; auto: CSV for a .csv or .tsv file, else JSONL.",
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


_INPUT_FLAGS = (
    "template",
    "force_model",
    "system",
    "embed_field",
    "id_field",
    "max_tokens",
    "temperature",
    "input_format",
)


def _job_config(flags: dict[str, Any], *, require_trust: bool = True) -> JobConfig:
    """The config file with the flags applied; takes the config flags out of ``flags``."""
    return with_overrides(
        load_config(flags.pop("config_path"), require_trust=require_trust),
        model=flags["model"],  # left in: it is also the model of records that name none
        rpm=flags.pop("rpm"),
        tpm=flags.pop("tpm"),
        itpm=flags.pop("itpm"),
        otpm=flags.pop("otpm"),
        max_in_flight=flags.pop("max_in_flight"),
        burst_requests=flags.pop("burst_requests"),
        burst_tokens=flags.pop("burst_tokens"),
        concurrency=flags.pop("concurrency"),
        price=flags.pop("price"),
        budget_usd=flags.pop("budget"),
        allow_unpriced=flags.pop("allow_unpriced"),
    )


def _input_opts(config: JobConfig, model: str | None, **flags: Any) -> InputOptions:
    force_model = bool(flags.get("force_model"))
    if force_model and model is None:
        fail("--force-model needs --model: the model to send every record to")
    template = flags.pop("template")
    embed_field = flags.get("embed_field")
    if embed_field is not None:
        chat_only = {
            "--template": template,
            "--system": flags["system"],
            "--max-tokens": flags["max_tokens"],
            "--temperature": flags["temperature"],
        }
        given = [flag for flag, value in chat_only.items() if value is not None]
        if given:
            fail(f"--embed embeds a field as it is; {', '.join(given)} shape chat prompts and do not apply")
    if template is not None and template.startswith("@"):
        try:
            template = Path(template[1:]).read_text(encoding="utf-8")
        except OSError as exc:
            fail(f"--template {template}: {exc.strerror}")
    return InputOptions(
        model=model,
        default_model=config.model,
        force_model=force_model,
        template=Template(template) if template is not None else None,
        system=flags["system"],
        id_field=flags["id_field"],
        max_tokens=flags["max_tokens"],
        temperature=flags["temperature"],
        format=flags["input_format"],
        embed_field=embed_field,
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
    help="Results JSONL (appended; one record per input record). Only ever this job's own file.",
)
@_config_options
@_input_options
@click.option("--ordered", is_flag=True, help="Write results in input order (default: as they complete).")
@click.option("--state", type=click.Path(path_type=Path), help="SQLite state file (default: OUTPUT with .sluice.db).")
@click.option("--retry-failed", is_flag=True, help="Send again the records the provider rejected (400/422).")
@click.option("--no-cache", is_flag=True, help="Do not serve identical requests from stored answers.")
@click.option("--strict", is_flag=True, help="Stop at the first bad input record instead of recording it.")
@click.option("--restart", is_flag=True, help="Start this job's output over (stored answers are still reused).")
@click.option("--overwrite", is_flag=True, help="Replace an existing OUTPUT that this job did not write.")
@click.option(
    "--adopt-output",
    is_flag=True,
    help="Continue an OUTPUT whose state file is gone, from its records (their cost counts against --budget).",
)
@click.option(
    "--grace",
    type=click.FloatRange(min=0),
    default=20.0,
    show_default=True,
    help="Seconds in-flight requests get to finish after Ctrl-C or SIGTERM; then they are cut off.",
)
@click.option(
    "--log-every",
    type=click.FloatRange(min=0.1),
    default=10.0,
    show_default=True,
    help="Seconds between progress lines when not on a terminal.",
)
@click.option(
    "--redis",
    "redis_url",
    metavar="URL",
    callback=checked_redis_url,
    help="Spread the job over `sluice worker`s through Redis (this process works on it too); "
    "limits and --budget are shared.",
)
@click.option(
    "--redis-fail-open",
    is_flag=True,
    help="With --redis: when Redis is away, keep admitting under local limits (the job queue still waits).",
)
@click.option("--no-local-worker", is_flag=True, help="With --redis: only coordinate; workers answer everything.")
@click.option(
    "--tier",
    type=click.Choice(["sync", "flex", "batch", "auto"]),
    default="sync",
    show_default=True,
    help="How requests are served: sync requests; OpenAI's flex processing (half price, slower); "
    "the provider's Batch API (half price, within 24 h; a rerun collects running batches); "
    "or auto: the Batch API, then sync requests for what it would not finish by --deadline.",
)
@click.option(
    "--deadline",
    callback=lambda ctx, param, value: None if value is None else duration(value, "--deadline"),
    metavar="DURATION",
    help="With --tier auto: when every line must be answered, from now (45s, 30m, 6h).",
)
@click.option(
    "--poll-every",
    type=click.FloatRange(min=0.1),
    default=30.0,
    show_default=True,
    metavar="SECONDS",
    help="With --tier batch: the most seconds between looks at a running batch (sooner when its "
    "progress says it is about to end).",
)
@click.option(
    "--batch-size",
    type=click.IntRange(1, 50_000),
    default=10_000,
    show_default=True,
    metavar="LINES",
    help="With --tier batch: lines per provider batch (about as many wait in memory).",
)
@click.option(
    "--schema",
    "schema_spec",
    metavar="FILE|module:Model",
    help="Every answer must be JSON of this shape: a JSON Schema file, or a Pydantic model "
    "(module:Model). Invalid answers are re-asked; a line's own response_format wins.",
)
@click.option(
    "--max-reasks",
    type=click.IntRange(min=0),
    default=MAX_REASKS,
    show_default=True,
    help="With a schema: times an invalid answer is asked again (each re-ask is billed, within --budget).",
)
@prompt_cache_option
@click.option("--claim-after", type=click.FloatRange(min=0.5), default=12.0, hidden=True)
@click.option("--max-deliveries", type=click.IntRange(min=1), default=5, hidden=True)
@otel_option
@_friendly
def run(input_path: Path, output: Path, **flags: Any) -> None:
    """Stream INPUT (JSONL chat bodies, OpenAI Batch API lines, or CSV/JSONL rows with
    --template) through the engine into OUTPUT. Rerun the same command to resume.

    \b
    Exit status:
      0  every record succeeded
      1  the job finished, but some records failed (see the summary)
      2  nothing was run: a flag, the config or a path is wrong
      3  the job stopped itself: --strict met a bad line, its first requests all
         failed the same way, or the state or output file could not be written
      4  the job finished, but the budget could not pay for some records
     70  an internal error (a bug in sluice; the traceback says where)
    130  interrupted (Ctrl-C, SIGTERM); rerun the same command to resume
    """
    from ..batch._runner import JobSpec, default_state_path
    from ._run import run_job_command

    _say_library_warnings()
    config = with_otel(with_tier(_job_config(flags), flags), flags.pop("otel"))
    config = dataclasses.replace(config, max_reasks=flags.pop("max_reasks"), prompt_cache=flags.pop("prompt_cache"))
    inputs = _input_opts(config, flags.pop("model"), **{k: flags[k] for k in _INPUT_FLAGS if k in flags})
    schema = schema_flag(flags.pop("schema_spec"), inputs, config)
    spec = JobSpec(
        input=input_path,
        output=output,
        state=flags["state"] or default_state_path(output),
        config=config,
        inputs=dataclasses.replace(inputs, schema=schema),
        ordered=flags["ordered"],
        retry_failed=flags["retry_failed"],
        cache=not flags["no_cache"],
        strict=flags["strict"],
        restart=flags["restart"],
        overwrite=flags["overwrite"],
        adopt_output=flags["adopt_output"],
        grace=flags["grace"],
        distributed=distributed_flags(flags),
    )
    sys.exit(run_job_command(spec, log_every=flags["log_every"]))


@main.command()
@click.option(
    "--redis", "redis_url", metavar="URL", required=True, callback=checked_redis_url, help="The Redis the jobs run in."
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path),
    help="TOML config: this machine's deployments, keys and base URLs (default: ./sluice.toml, once trusted).",
)
@click.option("--concurrency", type=click.IntRange(min=1), help="Requests this worker sends at once (all jobs).")
@click.option(
    "--grace",
    type=click.FloatRange(min=0),
    default=20.0,
    show_default=True,
    help="Seconds requests in flight get after SIGTERM or Ctrl-C; then they go back to the queue.",
)
@click.option("--redis-fail-open", is_flag=True, help="When Redis is away, keep admitting under local limits.")
@click.option("--name", help="The worker's name in summaries (default: HOST:PID).")
@otel_option
@_friendly
def worker(redis_url: str, **flags: Any) -> None:
    """Answer the requests of every job `sluice run --redis` has in Redis (and of new ones),
    with this machine's keys. Stops on SIGTERM or Ctrl-C, giving back what it holds."""
    from ._worker import run_worker

    _say_library_warnings()
    sys.exit(
        run_worker(
            redis_url,
            config_path=flags["config_path"],
            concurrency=flags["concurrency"],
            grace=flags["grace"],
            fail_open=flags["redis_fail_open"],
            name=flags["name"],
            otel=flags["otel"],
        )
    )


@main.command()
@click.argument("input_path", metavar="INPUT", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@_config_options
@_input_options
@click.option("--expected-output", type=click.IntRange(min=0), help="Output tokens you expect per request.")
@prompt_cache_option
@estimate_tier_option
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON (cost_usd as planned).")
@_friendly
def estimate(input_path: Path, **flags: Any) -> None:
    """Count INPUT's requests and tokens, the prompt-cache plan, the cost and the shortest
    time the limits allow; sends nothing."""
    from ..batch._estimate import estimate_job

    config = dataclasses.replace(_job_config(flags), prompt_cache=flags.pop("prompt_cache"))
    tier, expected_output, as_json = flags.pop("tier"), flags.pop("expected_output"), flags.pop("as_json")
    model = flags.pop("model")
    check_tier_providers(config if model is None else dataclasses.replace(config, model=model), tier)
    inputs = _input_opts(config, model, **flags)  # the rest are _INPUT_FLAGS
    result = estimate_job(input_path, config, inputs, expected_output=expected_output, tier=tier)
    if as_json:
        click.echo(json.dumps(result.as_json(), indent=2))
        return
    _print_table(f"sluice estimate {input_path}", result.rows())
    for line in result.examples_of_bad:
        click.echo(f"  {line}", err=True)


@main.command()
@click.argument("output", type=click.Path(path_type=Path))
@click.option(
    "--state", type=click.Path(path_type=Path), help="The job's state file (default: OUTPUT with .sluice.db)."
)
@_config_options
@_friendly
def cancel(output: Path, **flags: Any) -> None:
    """Cancel the provider batches of the job writing OUTPUT (run with --tier batch or
    auto). What they finished is kept: rerun the job to collect it and send the rest."""
    import asyncio

    from ..batch._cancel import cancel_job_batches
    from ..batch._runner import default_state_path

    state = flags.pop("state") or default_state_path(output)
    if not _is_sqlite(state):
        fail(f"{state} is not a sluice state file; give the job's output (its -o file) or --state")
    config = _job_config(flags)
    done = asyncio.run(cancel_job_batches(state, config))
    if not done:
        click.echo(f"sluice: no provider batch of this job is open ({state})")
        return
    for label, batch_id, status in done:
        click.echo(f"  {label}  {batch_id}  {status}")
    click.echo("sluice: rerun the job to collect what the batches finished; the rest is sent again", err=True)


@main.command()
@click.argument("state", required=False, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--html", type=click.Path(path_type=Path), help="Write the plotted report to this file (-: stdout).")
@click.option("--json", "as_json", is_flag=True, help="Print the report's figures as JSON instead of the table.")
@click.option("--force", is_flag=True, help="Let --html overwrite an existing file that is not a sluice report.")
@click.option("--redis", "redis_url", callback=checked_redis_url, help="A pipeline job's Redis (sluice.ray, .dask).")
@click.option("--job", "job_name", help="With --redis: the pipeline job's name (its job=).")
@_friendly
def report(
    state: Path | None, html: Path | None, as_json: bool, force: bool, redis_url: str | None, job_name: str | None
) -> None:
    """Summarise a job, finished or running, from its STATE file or output (--html: plotted; --json)."""
    from ..batch._output import looks_like_output
    from ..batch._report import report_rows
    from ..batch._runner import default_state_path
    from ._report import check_html_target, pipeline_report, plotted_report, refuse_clobbering

    if html is not None and (problem := check_html_target(html, as_json)) is not None:
        fail(problem)
    if (problem := pipeline_report(state, redis_url, job_name, html, as_json, _print_table)) != "":
        if problem is not None:
            fail(problem)
        return
    assert state is not None
    output = None
    if not _is_sqlite(state):
        beside = default_state_path(state)
        if beside.is_file():
            output, state = state, beside  # given the output: its state sits next to it
        elif looks_like_output(state):
            fail(
                f"{state} holds sluice records, but its state file {beside} is not there; "
                "give the state file itself (sluice report STATE), e.g. the --state the job ran with"
            )
        else:
            fail(
                f"{state} is not a sluice output or state file; give a job's output (its -o file) "
                "or its state file (OUTPUT.sluice.db)"
            )
    if html is not None and (problem := refuse_clobbering(html, state, output, force)) is not None:
        fail(problem)
    if html is None and not as_json:
        _print_table(f"sluice report {state}", report_rows(state))
    elif (problem := plotted_report(state, output, html, as_json)) is not None:
        fail(problem)


def _is_sqlite(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            return f.read(16) == b"SQLite format 3\x00"
    except OSError:
        return False


@main.command()
@click.argument("output", metavar="OUTPUT", type=click.Path(path_type=Path))
@click.option(
    "--csv", "csv_path", type=click.Path(path_type=Path), required=True, help="Write the records here as CSV."
)
def export(output: Path, csv_path: Path) -> None:
    """Write OUTPUT's records as a table: one row per input line, in line order, a
    schema's parsed answer opened up into columns (parsed.name, parsed.address.city...),
    then the line's metadata."""
    from ..batch._export import export_csv

    try:
        rows = export_csv(output, csv_path)
    except SluiceError as exc:
        fail(exc.message)
    click.echo(f"wrote {rows:,} rows to {csv_path}")


@main.group()
def config() -> None:
    """Inspect the configuration, and trust a ./sluice.toml to be read."""


_TRUST_WORDS = {
    None: "given with --config",
    "trusted": "found in this directory; trusted",
    "untrusted": "found in this directory; NOT trusted",
    "changed": "found in this directory; CHANGED since it was trusted",
}


@config.command("check")
@_config_options
@_friendly
def config_check(**flags: Any) -> None:
    """Validate the config file and print the effective configuration (keys masked).

    Exits 1 when the run would not start as configured: an untrusted ./sluice.toml, or
    an API key variable that is not set."""
    from ._config import missing_keys, untrusted_message

    effective = _job_config(flags, require_trust=False)  # shown for review; nothing is sent
    if effective.source is None:
        click.echo("config: (no config file; defaults and flags)")
    else:
        click.echo(f"config: {effective.source.resolve()} ({_TRUST_WORDS[effective.trust]})")
    budget = "-" if effective.budget_usd is None else f"${effective.budget_usd:,.2f}"
    click.echo(f"default model: {effective.model or '-'}   concurrency: {effective.concurrency}   budget: {budget}")
    retry = effective.retry
    click.echo(
        f"retry: {retry.max_attempts} attempts, backoff {retry.base_delay:g}s..{retry.max_delay:g}s, "
        f"deadline {retry.deadline}s, attempt timeout {retry.attempt_timeout}s, idle timeout {retry.idle_timeout}s, "
        f"Retry-After obeyed up to {retry.max_retry_after:g}s"
    )
    rows = describe(effective)
    defaults = describe_defaults(effective)
    if not rows and defaults is None:
        click.echo("deployments: none (models are served without local limits; they learn from headers)")
    for row in rows:
        _print_table(f"deployment {row.pop('deployment')}", list(row.items()))
    if defaults is not None:
        click.echo(defaults)
    for model, chain in effective.fallbacks.items():
        click.echo(f"fallbacks: {model} -> {' -> '.join(chain)}")
    cooldown = effective.cooldown
    click.echo(
        f"cooldown: after {cooldown.after_failures} failures in a row, {cooldown.seconds:g}s doubling to "
        f"{cooldown.max_seconds:g}s (deployments of a model with an alternative)"
    )
    problems = missing_keys(effective)
    if effective.source is not None and effective.trust not in (None, "trusted"):
        assert effective.trust is not None
        problems.insert(0, untrusted_message(effective.source.resolve(), effective.trust))
    for problem in problems:
        click.echo(f"sluice: {problem}", err=True)
    if problems:
        sys.exit(1)


@config.command("trust")
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path), default="sluice.toml", required=False)
@click.option("--revoke", is_flag=True, help="Stop trusting PATH.")
@_friendly
def config_trust(path: Path, revoke: bool) -> None:
    """Let sluice read PATH (default ./sluice.toml) without --config, as it is now.

    Read the file first: it says which servers requests (and API keys) go to. The trust
    covers these exact bytes; any edit needs trusting again. Records are kept in
    $SLUICE_TRUST_FILE, or $XDG_CONFIG_HOME/sluice/trusted.json."""
    from . import _trust
    from ._config import config_from_bytes, key_source, read_config_file

    if revoke:
        if _trust.revoke(path):
            click.echo(f"no longer trusted: {path.resolve()}")
        else:
            click.echo(f"{path.resolve()} was not trusted; nothing to revoke")
        return
    raw = read_config_file(path)
    trusted = config_from_bytes(raw, path)  # a file that does not parse is not worth trusting
    store = _trust.trust(path, raw)
    click.echo(f"trusted: {path.resolve()} (sha256 {_trust.fingerprint(raw)[:16]}…), recorded in {store}")
    for d in trusted.deployments:
        where = d.base_url or "the provider's default endpoint"
        click.echo(f"  {d.label}: requests go to {where}; key from {key_source(d)}")


from ._examples import add_examples  # noqa: E402
from ._serve import serve_command  # noqa: E402 - written in its own module, registered here

serve_command.callback = _friendly(serve_command.callback) if serve_command.callback else None
main.add_command(serve_command)
add_examples(main)  # each command's help ends on its most common use


def _print_table(title: str, rows: list[tuple[str, str]]) -> None:
    from ._progress import table

    table(title, rows)
