"""What a batch job is asked to do, what it has done so far, and when to give up early."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .._models import Request, Result
from ..store import Recovered, Spend
from ..store._key_filter import KeyFilter
from ._output import max_tokens_added

if TYPE_CHECKING:
    from .._config import JobConfig
    from .._engine import Engine
    from .._router import RouteStatus
    from .._stats import Stats
    from ._inputs import InputOptions

__all__ = ["Distributed", "FailFast", "JobProgress", "JobSpec", "Outcome"]

#: How a job ended, for the exit status: see ``JobProgress.outcome``.
Outcome = str

#: Lines of lost answers the summary names (the count covers them all).
_LOST_SHOWN = 20


@dataclass(frozen=True, slots=True)
class Distributed:
    """``sluice run --redis``: the job is spread over workers through Redis."""

    url: str
    #: Limits only (the job queue never fails open): admit without Redis when it is away.
    fail_open: bool = False
    #: The coordinator works on the job too (so one ``sluice run --redis`` completes it).
    local_worker: bool = True
    #: Seconds an entry may sit idle with a worker before others take it (its worker died).
    claim_after: float = 12.0
    #: Deliveries of one request before it becomes a dead letter (an error record).
    max_deliveries: int = 5


@dataclass(frozen=True, slots=True)
class JobSpec:
    input: Path
    output: Path
    state: Path
    config: JobConfig
    inputs: InputOptions
    ordered: bool = False
    retry_failed: bool = False
    cache: bool = True
    strict: bool = False
    restart: bool = False
    #: Replace an existing output that this job did not write.
    overwrite: bool = False
    #: Continue an output whose state file is gone, from its records.
    adopt_output: bool = False
    #: Seconds in-flight requests get to finish after a stop (Ctrl-C, SIGTERM).
    grace: float | None = 20.0
    #: Spread over workers through Redis (``--redis``); None runs it in this process.
    distributed: Distributed | None = None


@dataclass(slots=True)
class JobProgress:
    """Live counters of a job, read by the progress display and the summary."""

    total: int = 0
    already_done: int = 0
    repaired_bytes: int = 0
    redone: int = 0
    written: int = 0
    succeeded: int = 0
    failed: int = 0
    invalid: int = 0
    from_store: int = 0
    not_done: int = 0
    #: Answers received but not written, because the output could not be written (the
    #: state holds them: the rerun writes them, sending nothing).
    not_written: int = 0
    #: Answers received that neither the state nor the output could keep (both failed: a
    #: full disk): the rerun sends them again. Their lines, the first few of them.
    lost: int = 0
    lost_lines: list[int] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    finished: float | None = None
    stopping: bool = False
    #: When the stop was asked for (monotonic): its grace runs from here.
    stopped_at: float | None = None
    grace: float | None = None
    strict_error: str | None = None
    #: Why the job stopped early on its own (its first requests all failed the same way).
    fatal: str | None = None
    store_error: str | None = None
    output_error: str | None = None
    #: The job stopped while its disk still had room for what it had in flight (see ``_room``).
    disk_low: str | None = None
    engine: Engine | None = None
    errors: dict[str, int] = field(default_factory=dict)
    #: Dollars spent by earlier runs of this job (from the state file, or the output's records).
    spent_before: float = 0.0
    spend_before: Spend = field(default_factory=Spend)
    #: Attempts the last run left in flight (it crashed or was cut off): counted at their worst case.
    recovered: Recovered = field(default_factory=Recovered)
    #: Failures from earlier runs kept in the output (the request's own fault).
    kept_failures: int = 0
    #: Lines whose input changed since their record was written (redone).
    changed: int = 0
    #: The output was adopted from its records (its state file was gone).
    adopted: bool = False
    #: Lines that named a model of their own, which --model did not replace.
    own_model_lines: int = 0
    own_model_example: str | None = None
    #: Requests that got a max_tokens from the engine (a budget needs a cap), and answers cut there.
    capped: int = 0
    cut_at_cap: int = 0
    #: The whole input was read (not stopped early by --strict, Ctrl-C or an error).
    source_exhausted: bool = False
    #: A distributed job (``--redis``): records answered by each worker (host:pid) this run,
    #: and what they cost (the engine's figures are only this process's share).
    workers: dict[str, int] = field(default_factory=dict)
    workers_cost_usd: float = 0.0
    #: Each deployment's state as the run ended (cooling down, failed attempts, last error).
    deployments: list[RouteStatus] = field(default_factory=list)
    #: A distributed job's figures from its workers' records (requests sent, tokens,
    #: latency); None when the job runs in this process (the engine's own stats count).
    worker_stats: Stats | None = None
    #: Answers this run by tier (``sync``, ``flex``, ``batch``): [lines, dollars].
    tiers: dict[str, list[float]] = field(default_factory=dict)
    #: The provider batches this run followed, and each one's last status.
    batches: dict[str, str] = field(default_factory=dict)
    #: Lines a batch answered after ``--tier auto`` had moved them to synchronous requests
    #: that answered them too (both billed).
    answered_twice: int = 0
    #: Parked lines a batch answered plainly, written from the state without a second pass
    #: through the engine (see ``_writeback``).
    written_back: int = 0
    #: ``--tier auto``: the provider ids (custom ids) of the lines answered synchronously,
    #: in a Bloom filter (a set of them grew with the job: ~100 bytes a line).
    answered_sync: KeyFilter | None = None

    def note_sync(self, custom_id: str) -> None:
        """``--tier auto``: the line of ``custom_id`` was answered synchronously."""
        if self.answered_sync is None:
            self.answered_sync = KeyFilter(max(self.total, 1))
        self.answered_sync.add(custom_id)

    @property
    def complete(self) -> bool:
        """Every record of the input has its record in the output."""
        return (
            self.source_exhausted
            and not self.not_done
            and not self.not_written
            and not self.lost
            and not self.stopping
            and self.strict_error is None
        )

    @property
    def done(self) -> int:
        return self.already_done + self.written

    @property
    def left(self) -> int:
        """Lines with no record in the output yet (read this run or not): what a rerun does."""
        return max(0, self.total - self.done)

    @property
    def outcome(self) -> Outcome:
        """``succeeded`` (every record ok), ``failed`` (finished, some records failed),
        ``budget`` (finished, some not run for money), ``stopped`` (it stopped itself:
        --strict, its first requests all failing, the state or output unwritable) or
        ``interrupted`` (Ctrl-C, SIGTERM)."""
        if self.fatal or self.store_error or self.output_error or self.disk_low or self.strict_error:
            return "stopped"
        if not self.complete:
            return "interrupted"
        if self.errors.get("budget_exhausted"):
            return "budget"
        if self.failed or self.kept_failures:
            return "failed"
        return "succeeded"

    def count(self, result: Result, sent: Request | None = None) -> None:
        self.written += 1
        if result.cached:
            self.from_store += 1
        elif result.ok and result.tier is not None:
            tally = self.tiers.setdefault(result.tier, [0, 0.0])
            tally[0] += 1
            tally[1] += result.cost_usd or 0.0
        if sent is not None and max_tokens_added(sent, result) is not None:
            self.capped += 1
            if result.finish_reason in ("length", "max_tokens"):
                self.cut_at_cap += 1
        if result.ok:
            self.succeeded += 1
            return
        self.failed += 1
        kind = result.error.kind if result.error is not None else "error"
        if kind == "invalid_input":
            self.invalid += 1
        self.errors[kind] = self.errors.get(kind, 0) + 1

    def note_lost(self, line: int) -> None:
        """An answer to ``line`` was received and could be kept nowhere."""
        self.lost += 1
        if len(self.lost_lines) < _LOST_SHOWN:
            self.lost_lines.append(line)

    def note_own_model(self, model: str) -> None:
        self.own_model_lines += 1
        if self.own_model_example is None:
            self.own_model_example = model

    def stop(self) -> None:
        """Stop admitting; in-flight requests get the grace period to finish and be recorded."""
        self.stopping = True
        if self.stopped_at is None:
            self.stopped_at = time.monotonic()
        if self.engine is not None:
            self.engine.stop(grace=self.grace)


#: Failures that say the setup is wrong (key, URL, model, price), not one request.
_SETUP_KINDS = {
    "authentication_error": "check the API key (`sluice config check` shows where it comes from)",
    "permission_denied": "check that the key may use this model",
    "config_error": "fix the configuration",
    "connection_error": "check base_url and that the server is reachable",
    "not_found": "check the model name and base_url",
    "unknown_price": "give the model a price (--price IN,OUT) or allow unpriced models (--allow-unpriced)",
}


class FailFast:
    """Stop a job whose first requests all fail the same way, instead of failing every line.

    A 100k-line job with a wrong key would otherwise be paced through at the configured
    rate, every line recorded as failed. Lines the input itself got wrong do not count
    either way; the first success disarms it.
    """

    __slots__ = ("_armed", "_first", "_kind", "_needed", "_seen")

    WINDOW = 10

    def __init__(self, total: int) -> None:
        self._needed = max(1, min(self.WINDOW, total))
        self._seen = 0
        self._kind: str | None = None
        self._first = ""
        self._armed = True

    def observe(self, result: Result) -> str | None:
        """The message to stop with, once the evidence is in; else None."""
        if not self._armed or result.cached:
            return None
        error = result.error
        if error is None or error.kind not in _SETUP_KINDS or self._kind not in (None, error.kind):
            self._armed = error is not None and error.kind == "invalid_input" and self._armed
            return None
        self._kind = error.kind
        self._first = self._first or error.message
        self._seen += 1
        if self._seen < self._needed:
            return None
        self._armed = False
        return (
            f"the first {self._seen} requests all failed the same way ({self._kind}): {self._first}; "
            f"{_SETUP_KINDS[self._kind]}, then rerun the same command"
        )
