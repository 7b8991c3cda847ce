"""``sluice run``: the job with live progress, signals, a summary, and a truthful exit status."""

from __future__ import annotations

import click

from ..batch._job import JobProgress, JobSpec
from ..batch._runner import run_job
from ._progress import ProgressView, summary_rows, table, usd
from ._signals import run_until_stopped

__all__ = ["EXIT_CODES", "run_job_command"]

#: The exit status of each outcome (documented in ``sluice run --help`` and the README).
EXIT_CODES = {"succeeded": 0, "failed": 1, "stopped": 3, "budget": 4, "interrupted": 130}


def run_job_command(spec: JobSpec, *, log_every: float) -> int:
    """Run the job to its end (or a stop), print the summary; the exit status."""
    progress = JobProgress()
    view = ProgressView(progress, every=log_every)

    def stopping() -> None:
        progress.stop()
        view.tick()

    view.start()
    try:
        aborted = run_until_stopped(lambda: run_job(spec, progress, view.tick), stopping)
    finally:
        view.stop()
    rows = [*summary_rows(progress), ("output", str(spec.output)), ("state", str(spec.state))]
    if progress.workers:  # a distributed job (--redis): what every worker did
        answered = sorted(progress.workers.items(), key=lambda item: (-item[1], item[0]))
        rows.append(("answered by", ", ".join(f"{name} {count:,}" for name, count in answered)))
        cost = progress.workers_cost_usd
        if cost or progress.spent_before:  # else no answer had a known price
            in_all = usd(progress.spent_before + cost)
            rows.append(("cost (all workers)", f"{usd(cost)} this run; {in_all} with earlier runs"))
    table("sluice run", rows)
    for line in closing_lines(progress, aborted=aborted):
        click.echo(f"sluice: {line}", err=True)
    return EXIT_CODES["interrupted"] if aborted else EXIT_CODES[progress.outcome]


def closing_lines(progress: JobProgress, *, aborted: bool = False) -> list[str]:
    """What a person must know when the job ends, each with what to do next."""
    lines: list[str] = []
    recovered = progress.recovered
    if recovered.in_batches:
        lines.append(
            f"{recovered.in_batches:,} lines of the last run were waiting in provider batches; they are "
            "collected from them, not sent again"
        )
    if recovered.requests:
        worst = recovered.worst_usd
        counted = f" (counted at their worst case, {usd(worst)})" if worst else ""
        lines.append(
            f"{recovered.requests:,} requests were in flight when the last run stopped; they are "
            f"sent again and may be billed twice{counted}"
        )
    if progress.changed:
        lines.append(f"{progress.changed:,} lines changed in the input since their records were written; redone")
    if progress.own_model_lines:
        lines.append(
            f"{progress.own_model_lines:,} records named their own model (e.g. {progress.own_model_example}), "
            "which --model does not replace; add --force-model to send every record to --model"
        )
    if progress.cut_at_cap:
        lines.append(
            f"{progress.cut_at_cap:,} answers were cut at the max_tokens the budget required (their records "
            "say max_tokens_added); give max_tokens per record or raise the deployment's default_max_tokens"
        )
    if progress.store_error is not None:
        lines.append(
            f"stopped: {progress.store_error}. Everything answered before is kept (answers after it went "
            "to the output only); fix the cause and rerun the same command to resume"
        )
    if progress.output_error is not None:
        lines.append(
            f"stopped: {progress.output_error}. Every answer is in the state file; fix the cause and rerun "
            "the same command: it writes them without sending them again"
        )
    if progress.fatal is not None:
        lines.append(f"stopped early: {progress.fatal}")
    if progress.strict_error is not None:
        lines.append(f"{progress.strict_error} (--strict: stopped here; fix it and rerun to resume)")
    exhausted = progress.errors.get("budget_exhausted", 0)
    if exhausted and progress.engine is not None:
        budget = progress.engine.spending.budget
        left = f"the {usd(max(0.0, budget.remaining()))} left of the {usd(budget.limit)} budget" if budget else "it"
        lines.append(
            f"{exhausted:,} records were not run: their worst case did not fit {left}; "
            "rerun with a larger --budget to resume them"
        )
    redo = [f"{count:,} {kind}" for kind, count in progress.errors.items() if kind not in ("budget_exhausted",)]
    if redo:
        lines.append(
            f"failed this run: {', '.join(redo)}; a plain rerun redoes them, except rejections of the request "
            "itself (bad_request), which --retry-failed sends again, and invalid_input, which needs the line fixed"
        )
    if progress.kept_failures:
        lines.append(
            f"{progress.kept_failures:,} failures from earlier runs were kept (the provider rejected those "
            "requests); --retry-failed sends them again"
        )
    if aborted or progress.outcome == "interrupted":
        lines.append("interrupted; rerun the same command to resume (nothing answered is sent again)")
    return lines
