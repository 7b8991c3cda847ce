"""What a person sees while a job runs and when it ends.

On a terminal: one live line (done/total, req/s, tokens/s, errors, retries, 429s, ETA).
Elsewhere (CI logs, ``nohup``): a plain line every ``every`` seconds. At the end: a
summary table that says where the output and the state are.
"""

from __future__ import annotations

import sys
import time
from typing import IO, Any

import click

from .._format import format_duration, usd
from .._models import TIER_DISCOUNT
from ..batch._job import JobProgress
from ..batch._report import structured_line
from ..caching._report import summary_rows as cache_rows

__all__ = ["ProgressView", "format_duration", "summary_rows", "table", "usd"]


def _compact(n: float) -> str:
    for unit, size in (("M", 1e6), ("k", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.1f}{unit}"
    return f"{n:.0f}" if n == int(n) else f"{n:.1f}"


def status_line(progress: JobProgress, width: int | None = None) -> str:
    """The live line; at most ``width`` characters when given (a terminal's: a line that
    wraps is redrawn as two, and scrolls), the least needed parts left out first."""
    elapsed = max(1e-9, time.monotonic() - progress.started)
    stats = progress.engine.stats if progress.engine is not None else progress.worker_stats
    rate = progress.written / elapsed
    tokens = (stats.input_tokens + stats.output_tokens) / elapsed if stats else 0.0
    remaining = progress.left
    eta = 0.0 if not remaining else remaining / rate if rate > 0 else None
    share = 100.0 * progress.done / progress.total if progress.total else 100.0
    # (the part, how soon it goes when the line is too wide: 0 never)
    parts = [
        (f"{progress.done:,}/{progress.total:,} ({share:.1f}%)", 0),
        (f"{rate:,.1f} req/s", 3),
        (f"{_compact(tokens)} tok/s", 6),
        (f"errors {progress.failed:,}", 2),
    ]
    if stats is not None and progress.engine is not None:
        parts += [(f"retries {stats.retries:,}", 5), (f"429s {stats.rate_limited:,}", 4)]
        spend = _spend(progress)
        if spend:
            parts.append((spend, 2))
    if progress.engine is not None:
        parts += [(s.describe(), 1) for s in progress.engine.deployment_status() if s.state != "ok"]
    if progress.batches:
        parts.append(("batches " + _batch_counts(progress.batches), 1))
    parts.append((f"ETA {format_duration(eta)}", 0))
    if progress.stopping:
        parts.append(("stopping: finishing in-flight requests (Ctrl-C again to abort)", 0))
    line = "  ".join(text for text, _ in parts)
    for level in range(6, 0, -1):
        if width is None or len(line) <= width:
            break
        parts = [(text, drop) for text, drop in parts if drop != level]
        line = "  ".join(text for text, _ in parts)
    if width is not None and len(line) > width:
        line = line[: max(0, width - 1)] + "…"
    return line


def _spend(progress: JobProgress) -> str:
    """``$1.2345`` spent (of the budget), or nothing when no price is known at all."""
    engine = progress.engine
    if engine is None:
        return ""
    budget = engine.spending.budget
    if budget is not None:
        return f"{usd(budget.spent())} of {usd(budget.limit)}"
    if engine.stats.total_cost_usd or not engine.stats.unpriced:
        return usd(progress.spent_before + engine.stats.total_cost_usd)
    return ""


class ProgressView:
    """A live line on a terminal, periodic plain lines otherwise."""

    def __init__(self, progress: JobProgress, stream: IO[str] | None = None, every: float = 10.0) -> None:
        self.progress = progress
        self.stream = stream or sys.stderr
        self.every = every
        self._live: Any = None
        self._last = 0.0

    def start(self) -> None:
        if self.stream.isatty():
            from rich.console import Console
            from rich.live import Live

            console = Console(file=self.stream)
            self._live = Live("", console=console, refresh_per_second=4, transient=True)
            self._live.start()

    def tick(self) -> None:
        if self._live is not None:
            from rich.text import Text

            console = self._live.console
            line = status_line(self.progress, width=console.width - 1)  # the last column wraps on some terminals
            self._live.update(console.highlighter(Text(line, no_wrap=True, overflow="ellipsis")))
            return
        line = status_line(self.progress)
        now = time.monotonic()
        if now - self._last >= self.every:
            self._last = now
            print(f"[sluice] {line}", file=self.stream, flush=True)

    def stop(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None


def _cost_summary(progress: JobProgress) -> str:
    """This run's answers and possibly-billed failures, earlier runs, the total and the
    budget: figures that add up (total = earlier + this run; left = budget - total)."""
    assert progress.engine is not None
    stats, spending = progress.engine.stats, progress.engine.spending
    text = f"{usd(stats.cost_usd)} answers"
    if stats.maybe_billed_usd:
        text += f" + {usd(stats.maybe_billed_usd)} possibly billed (failed attempts, at their worst case)"
    text += " this run"
    if progress.spent_before:
        text += (
            f"; {usd(progress.spent_before)} earlier runs; {usd(progress.spent_before + stats.total_cost_usd)} in all"
        )
    if spending.budget is not None:
        text += f" (budget {usd(spending.budget.limit)}, {usd(max(0.0, spending.budget.remaining()))} left)"
    if stats.unpriced:
        models = ", ".join(sorted(spending.unpriced_models))
        answers = "answer" if stats.unpriced == 1 else "answers"
        text += f"; {stats.unpriced:,} {answers} from models with no known price ({models}) not included"
    return text


def summary_rows(progress: JobProgress) -> list[tuple[str, str]]:
    elapsed = (progress.finished or time.monotonic()) - progress.started
    stats = progress.engine.stats if progress.engine is not None else progress.worker_stats
    rows = [
        ("records", f"{progress.total:,}"),
        ("done", f"{progress.done:,} ({progress.already_done:,} from earlier runs)"),
        ("succeeded (this run)", f"{progress.succeeded:,}"),
        ("failed (this run)", f"{progress.failed:,}"),
    ]
    for kind, count in sorted(progress.errors.items(), key=lambda kv: -kv[1]):
        rows.append((f"  {kind}", f"{count:,}"))
    if progress.kept_failures:
        rows.append(("failures kept", f"{progress.kept_failures:,} from earlier runs (--retry-failed redoes them)"))
    if progress.left:
        rows.append(("not done", _not_done(progress)))
    rows.append(("served from the state", f"{progress.from_store:,} (not sent again)"))
    if stats is not None:
        # a distributed job knows its workers' answers, not the 429s each of them met
        four_twenty_nines = f", {stats.rate_limited:,} x 429" if progress.engine is not None else ""
        sent = f"{stats.attempts:,} ({stats.retries:,} retries{four_twenty_nines})"
        if progress.engine is None:
            sent += " by every worker"
        rows += [("requests sent", sent), ("tokens", f"{stats.input_tokens:,} in, {stats.output_tokens:,} out")]
        rows += _latency_rows(progress, stats.latency.percentile(50), stats.latency.percentile(99))
    if progress.engine is not None:
        rows.append(("cost", _cost_summary(progress)))
    if stats is not None and (stats.valid or stats.reasks or stats.errors.get("invalid_output")):
        invalid = stats.errors.get("invalid_output", 0)
        line = structured_line(
            valid=stats.valid,
            reasked=stats.reasked,
            invalid=invalid,
            reasks=stats.reasks,
            reask_cost_usd=stats.reask_cost_usd,
        )
        rows.append(("structured (this run)", line))
    rows += _tier_rows(progress)
    if progress.engine is not None and progress.engine.attempts.caching is not None:
        rows += cache_rows(progress.engine.attempts.caching.summary())
    rows += _troubled_deployments(progress)
    rate = progress.written / elapsed if elapsed > 0 else 0.0
    rows.append(("elapsed", f"{format_duration(elapsed)} ({rate:,.1f} records/s)"))
    if progress.repaired_bytes:
        rows.append(("repaired", f"cut a half-written last line ({progress.repaired_bytes} bytes)"))
    if progress.redone:
        rows.append(("redone", f"{progress.redone:,} earlier records (failed, or their line changed) were redone"))
    if progress.adopted:
        rows.append(("adopted", "the output's records were kept though its state file was gone"))
    return rows


def _latency_rows(progress: JobProgress, p50: float | None, p99: float | None) -> list[tuple[str, str]]:
    """Latency of the answers that were timed: a provider batch's lines are not, one by one."""
    batched = progress.tiers.get("batch", [0, 0.0])[0]
    if p50 is None or p99 is None:
        return [("latency", "n/a: batch answers are not timed one by one")] if batched else []
    return [("latency", f"p50 {p50:.3f}s, p99 {p99:.3f}s" + (" (synchronous answers)" if batched else ""))]


def _tier_rows(progress: JobProgress) -> list[tuple[str, str]]:
    """What each tier answered and cost, against the same answers all synchronous (at the
    published discounts); the provider batches and how they ended."""
    if set(progress.tiers) <= {"sync"} and not progress.batches:
        return []
    parts, all_sync = [], 0.0
    rows = []
    for tier in ("batch", "flex", "sync"):
        if tier in progress.tiers:
            lines, cost = progress.tiers[tier]
            parts.append(f"{tier} {int(lines):,} ({usd(cost)})")
            all_sync += cost / TIER_DISCOUNT[tier]
    if parts:
        rows.append(("tiers", ", ".join(parts) + f"; all sync would have cost ~{usd(all_sync)}"))
    if progress.batches:
        text = _batch_counts(progress.batches)
        running = sum(1 for status in progress.batches.values() if status not in _BATCH_ENDED)
        if running:
            text += f"; {running} still running at the provider: rerun the same command to collect them"
        rows.append(("provider batches", text))
    if progress.written_back:
        rows.append(("written back", f"{progress.written_back:,} answers straight from the batches' results"))
    if progress.answered_twice:
        rows.append(
            (
                "answered twice",
                f"{progress.answered_twice:,} lines (a batch answered them after the deadline "
                "moved them to synchronous requests; both were billed)",
            )
        )
    return rows


_BATCH_ENDED = ("completed", "failed", "expired", "cancelled", "ended")


def _batch_counts(batches: dict[str, str]) -> str:
    """``2 in_progress, 1 completed``: the provider's own status names."""
    counts: dict[str, int] = {}
    for status in batches.values():
        counts[status] = counts.get(status, 0) + 1
    return ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))


def _troubled_deployments(progress: JobProgress) -> list[tuple[str, str]]:
    """Each deployment that failed attempts or is cooling down, with what it last said:
    the summary must not leave a dead deployment for ``sluice report`` to reveal."""
    rows = []
    for status in progress.deployments:
        if not status.failed and status.state == "ok":
            continue
        state = f"cooling down, {status.seconds_left:.0f} s left" if status.state == "cooling down" else status.state
        text = f"{state}; {status.answered:,} answered, {status.failed:,} failed attempts"
        if status.last_error is not None:
            said = f": {_clip(status.last_message)}" if status.last_message else ""
            text += f"; last error {status.last_error}{said}"
        rows.append((f"deployment {status.deployment}", text))
    return rows


def _clip(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _not_done(progress: JobProgress) -> str:
    """The lines a rerun writes a record for: every line without one, read or not."""
    text = f"{progress.left:,} (a rerun does them"
    if progress.not_written:
        text += f"; {progress.not_written:,} of them are answered in the state and are only written, not sent"
    if progress.lost:
        text += f"; {progress.lost:,} of them were answered but could be kept nowhere, and are sent again"
    return text + ")"


def table(title: str, rows: list[tuple[str, str]]) -> None:
    """A rich table on a terminal; plain ``name: value`` lines in logs and pipes."""
    if not sys.stdout.isatty():
        width = max((len(name) for name, _ in rows), default=0)
        click.echo(title)
        for name, value in rows:
            click.echo(f"  {name.ljust(width)}  {value}")
        return
    from rich.console import Console
    from rich.table import Table

    view = Table(title=title, show_header=False, title_justify="left")
    view.add_column(style="bold")
    view.add_column()
    for name, value in rows:
        view.add_row(name, value)
    Console().print(view)
