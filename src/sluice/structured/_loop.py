"""Ask until the answer parses: the re-ask loop around the attempt core's retry loop.

Every re-ask goes through :meth:`~sluice._attempts.Attempts.until_outcome` like the first
ask: money reserved at its worst case, capacity, the durable intent, retries of its own.
So a budget stops re-asks before it is exceeded (the re-ask that does not fit is not
sent), and what each one cost is in the line's ``cost_usd`` (``reask_cost_usd`` says how
much of it).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .._errors import BudgetExhaustedError, CancelledError, InvalidOutputError, InvalidRequestError, SluiceError
from ._check import check
from ._reask import reask

if TYPE_CHECKING:
    from .._attempts import Attempts
    from .._job import Job
    from .._models import Result, Usage
    from .._slot import Tally
    from ..providers import Reply

__all__ = ["generation_after", "reask_cost", "until_valid"]


async def until_valid(
    attempts: Attempts, job: Job, tally: Tally, deadline: float | None, reply: Reply
) -> tuple[Reply, SluiceError | None, object]:
    """(the last answer, with every ask's usage; the line's error or None; the parsed value).

    The error is :class:`InvalidOutputError` when the answers stayed invalid (or a re-ask
    could not be made: it can never fit, the provider failed it); ``BudgetExhaustedError``
    when the money left could not pay for the next re-ask; ``InvalidRequestError`` when the
    schema's own code failed on an answer; a ``CancelledError`` when a stop cut a re-ask off
    (a stop sends no new re-ask: the rerun asks the line again)."""
    schema = job.request.schema
    assert schema is not None
    usage = reply.usage
    while True:
        if schema.regex or schema.model is not None:  # a regex or a model's own code may take long
            verdict = await asyncio.to_thread(check, schema, reply.text, reply.finish_reason)
        else:
            verdict = check(schema, reply.text, reply.finish_reason)
        if verdict.ok:
            return dataclasses.replace(reply, usage=usage), None, verdict.parsed
        if verdict.broken is not None:  # the schema's own code failed: asking again cannot help
            return dataclasses.replace(reply, usage=usage), InvalidRequestError(f"schema: {verdict.broken}"), None
        after = f"after {job.reasks} re-ask{'s' if job.reasks != 1 else ''}, " if job.reasks else ""
        said = f"{after}the answer does not match the schema {schema.name!r}: {'; '.join(verdict.errors)}"
        if job.reasks >= attempts.max_reasks:
            return _invalid(job, reply, usage, said, verdict.errors)
        deployment = job.route.deployment
        cap = job.request.max_tokens or deployment.default_max_tokens
        question = reask(job.request, reply.text, verdict, output_cap=cap, answered_tokens=reply.usage.output_tokens)
        try:
            attempts.replan(job, question)
        except SluiceError as exc:  # the re-ask can never fit (its deployment's limits)
            return _invalid(job, reply, usage, f"{said}; it could not be re-asked: {exc.message}", verdict.errors)
        job.reasks += 1
        job.attempts_before = tally.attempts
        attempts.settle_handed_over(tally)  # the last answer's intent: another attempt follows
        outcome = await attempts.until_outcome(job, tally, deadline, hand_over=attempts.settling)
        if isinstance(outcome, CancelledError):
            return reply, outcome, None
        if isinstance(outcome, SluiceError):
            if tally.attempts == job.attempts_before:  # refused before it was sent: not made
                job.reasks -= 1
                why = f"{said}; no further re-ask was made: {outcome.message}"
                if isinstance(outcome, BudgetExhaustedError):  # the money, not the model: exit 4, rerun
                    return dataclasses.replace(reply, usage=usage), BudgetExhaustedError(why), None
            else:
                why = f"{said}; re-ask {job.reasks} was not answered: {outcome.message}"
            return _invalid(job, reply, usage, why, verdict.errors)
        usage = usage + outcome.usage
        reply = outcome


def _invalid(
    job: Job, reply: Reply, usage: Usage, message: str, errors: tuple[str, ...]
) -> tuple[Reply, SluiceError, object]:
    return dataclasses.replace(reply, usage=usage), InvalidOutputError(message, errors, job.generation), None


def generation_after(record: Mapping[str, Any]) -> int:
    """The generation of a rerun's asks of a line stored as ``invalid_output`` (else 0)."""
    error = record.get("error")
    if not isinstance(error, Mapping) or error.get("type") != "invalid_output":
        return 0
    generation = error.get("generation")
    return (generation if isinstance(generation, int) and not isinstance(generation, bool) else 0) + 1


def reask_cost(result: Result, before: float) -> float | None:
    """Of a result's cost, what came after its first answer (its re-asks)."""
    return None if result.cost_usd is None else max(0.0, result.cost_usd - before)
