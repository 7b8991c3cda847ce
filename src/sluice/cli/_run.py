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
    stopped_on_disk = _stopped_on_disk(progress)
    if stopped_on_disk is not None:
        lines.append(stopped_on_disk)
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


def _stopped_on_disk(progress: JobProgress) -> str | None:
    """Why the state or the output took no more, and where each answer received is kept:
    one message, true to what happened (a full disk often fails both)."""
    failures = [e for e in (progress.store_error, progress.output_error) if e is not None]
    if not failures:
        if progress.disk_low is None:
            return None
        return (
            f"stopped: {progress.disk_low}. Every answer received is kept; free space (or lower --concurrency), "
            "then rerun the same command to resume"
        )
    kept: list[str] = []
    if progress.store_error is not None and progress.output_error is None:
        kept.append("every answer received is kept: those before it in the state, those after it in the output")
    elif progress.not_written:
        kept.append(
            f"{progress.not_written:,} answers are in the state only: the rerun writes them without sending them again"
        )
    if progress.lost:
        shown = ", ".join(map(str, progress.lost_lines))
        more = (
            f" and {progress.lost - len(progress.lost_lines):,} more"
            if progress.lost > len(progress.lost_lines)
            else ""
        )
        kept.append(
            f"{progress.lost:,} answers received could be kept in neither the state nor the output (lines "
            f"{shown}{more}): the rerun sends them again, and they are billed twice"
        )
    elif progress.output_error is not None:
        kept.append("every answer received is in the state or the output: the rerun sends none of them again")
    return (
        f"stopped: {'; '.join(failures)}. {'; '.join(kept)}. Fix the cause (free space) and rerun the same "
        "command to resume"
    )
