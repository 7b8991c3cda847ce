"""Anthropic's Message Batches, as its clients read them: the MessageBatch object and
the lines of its results file.

A Message Batch is run as an internal batch of ``_run`` (endpoint ``/v1/messages``):
:func:`message_batch` maps that batch's status and counts to Anthropic's view, and
:func:`result_line` turns a request's stored outcome into Anthropic's result line. As
Anthropic documents them, ``request_counts`` other than ``processing`` stay zero until
the whole batch has ended, and times are RFC 3339 strings.

``results_url`` is the path of the results on this server (``/v1/messages/batches/<id>/results``),
which the SDKs join to the base URL they were given: an absolute URL would have to guess
the scheme and host the client reached the server by (a proxy in front changes both), and
the SDK sends its key to whatever that URL names.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from ..._records import error_from_record
from ...shapes.messages._errors import ERROR_TYPES, anthropic_error_body, error_type_for
from ...shapes.messages._out import message_from_chat
from ..core._context import error_for
from ..core._errors import UPSTREAM_AUTH, upstream_auth_failed
from ._shapes import chat_body, usage_of

__all__ = ["ENDED", "errored_result", "message_batch", "processing_status", "result_line", "results_path"]

#: Internal statuses of a batch whose processing has ended.
ENDED = ("completed", "failed", "cancelled", "expired")
_STAMPS = ("completed_at", "cancelled_at", "expired_at", "failed_at")
#: sluice's error kinds that have an Anthropic type of their own (the rest go by status).
_KINDS = {"model_not_found": "not_found_error", "budget_exhausted": "billing_error", "timeout": "timeout_error"}


def processing_status(status: str) -> str:
    """Anthropic's ``processing_status`` for an internal batch status."""
    if status in ENDED:
        return "ended"
    return "canceling" if status == "cancelling" else "in_progress"


def _time(stamp: Any) -> str | None:
    if not isinstance(stamp, int | float):
        return None
    return datetime.fromtimestamp(stamp, UTC).isoformat().replace("+00:00", "Z")


def results_path(batch_id: str) -> str:
    return f"/v1/messages/batches/{batch_id}/results"


def message_batch(batch: Mapping[str, Any]) -> dict[str, Any]:
    """The MessageBatch object for an internal batch (its live copy when it is running)."""
    status = processing_status(batch["status"])
    counts = batch.get("request_counts") or {}
    total = int(counts.get("total") or 0)
    tally = {"processing": total, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0}
    ended_at = None
    if status == "ended":
        ended_at = next((batch[k] for k in _STAMPS if batch.get(k) is not None), None)
        if batch["status"] == "failed":  # the batch could not run: every request errored
            tally.update(processing=0, errored=total)
        else:
            succeeded, errored = int(counts.get("completed") or 0), int(counts.get("failed") or 0)
            never = max(total - succeeded - errored, 0)
            tally.update(processing=0, succeeded=succeeded, errored=errored)
            tally["expired" if batch["status"] == "expired" else "canceled"] = never
    return {
        "id": batch["id"],
        "type": "message_batch",
        "processing_status": status,
        "request_counts": tally,
        "ended_at": _time(ended_at),
        "created_at": _time(batch["created_at"]),
        "expires_at": _time(batch["expires_at"]),
        "archived_at": None,
        "cancel_initiated_at": _time(batch.get("cancelling_at")),
        "results_url": results_path(batch["id"]) if status == "ended" else None,
    }


def result_line(
    custom_id: str | None,
    record: Mapping[str, Any] | None,
    ok: bool,
    *,
    model: str,
    final: str,
    scrub: Callable[[str], str],
) -> dict[str, Any]:
    """One request's line of the results file: ``record`` is its stored outcome (None:
    never run, so canceled or expired as the batch ended)."""
    if record is None:
        result: dict[str, Any] = {"type": "expired" if final == "expired" else "canceled"}
    elif ok:
        message = message_from_chat(chat_body(record), model=model, usage=usage_of(record))
        result = {"type": "succeeded", "message": message}
    else:
        result = errored_result(_error_type(record.get("error") or {}), _message(record, scrub))
    return {"custom_id": custom_id, "result": result}


def errored_result(kind: str, message: str) -> dict[str, Any]:
    return {"type": "errored", "error": anthropic_error_body(kind, message)}


def _error_type(error: Mapping[str, Any]) -> str:
    """Anthropic's type for a stored error: an Anthropic deployment's own, else by what
    sluice's error means, else by the status the server would have answered."""
    if error.get("type") in UPSTREAM_AUTH:  # the server's key, not the client's: a gateway failure
        return error_type_for(502)
    given = error.get("provider_type")
    if isinstance(given, str) and given in ERROR_TYPES.values():
        return given
    kind = str(error.get("type") or "")
    if kind in _KINDS:
        return _KINDS[kind]
    status = error.get("status")
    if not isinstance(status, int):
        status = error_for(error_from_record(error))[0]
    return error_type_for(status)


def _message(record: Mapping[str, Any], scrub: Callable[[str], str]) -> str:
    """The error's words for the client: no upstream host, no advice meant for the CLI."""
    error = record.get("error") or {}
    if error.get("type") in UPSTREAM_AUTH:  # the server's own key refused: never the provider's words
        return upstream_auth_failed(error.get("status"))
    said = str(error.get("message") or "the request failed")
    return scrub(said.split("; rerun with", 1)[0])
