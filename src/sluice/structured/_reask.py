"""The question asked again after an invalid answer.

An answer cut off at ``max_tokens`` is asked again as it was, with twice the room (a
longer conversation would not help it fit); any other invalid answer is shown back to
the model with what the validator found, and the model is asked to correct it. Each
re-ask is a new attempt: reserved against the limits and the budget before it is sent.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .._models import Request
    from ._check import Verdict

__all__ = ["reask"]


def reask(request: Request, text: str | None, verdict: Verdict, *, output_cap: int, answered_tokens: int) -> Request:
    """The next ask of ``request`` after ``text`` was found invalid (``verdict``).

    ``output_cap`` is the cap the answer was given (the request's ``max_tokens``, or the
    deployment's default); ``answered_tokens`` what the answer used."""
    if verdict.truncated:
        return dataclasses.replace(request, max_tokens=2 * max(output_cap, answered_tokens, 1))
    problems = "\n".join(f"- {error}" for error in verdict.errors)
    correction = (
        f"That answer does not match the required JSON schema:\n{problems}\n"
        "Answer again with only the corrected JSON, no prose and no markdown."
    )
    messages = [
        *request.messages,
        {"role": "assistant", "content": text if text else "(an empty answer)"},
        {"role": "user", "content": correction},
    ]
    return dataclasses.replace(request, messages=messages)
