"""Results as plain JSON-able records, and back: for the store, the output file and reports.

A record never holds an API key: a Result never had one (keys live in Secrets on the
Deployment, which a record does not include).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from . import _errors
from ._models import Request, Result, Timings, Usage

__all__ = ["error_from_record", "error_record", "result_from_record", "result_record", "usage_record"]


def _error_classes() -> dict[str, type[_errors.SluiceError]]:
    classes: dict[str, type[_errors.SluiceError]] = {}
    pending: list[type[_errors.SluiceError]] = [_errors.SluiceError]
    while pending:
        cls = pending.pop()
        classes.setdefault(cls.kind, cls)
        pending.extend(cls.__subclasses__())
    return classes


_BY_KIND = _error_classes()


def usd_record(cost: float | None) -> float | None:
    """Dollars as a record holds them: to the picodollar, without the float noise of summed
    token prices (``0.000010799999999999998`` is ``1.08e-05``)."""
    return None if cost is None else round(cost, 12)


def usage_record(usage: Usage) -> dict[str, int]:
    record = {
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "cached_input_tokens": usage.cached_input_tokens,
        "reasoning_tokens": usage.reasoning_tokens,
        "cache_write_tokens": usage.cache_write_tokens,
    }
    if usage.cache_write_1h_tokens:  # only where there are some: records of other answers keep their shape
        record["cache_write_1h_tokens"] = usage.cache_write_1h_tokens
    return record


def error_record(error: _errors.SluiceError) -> dict[str, Any]:
    record: dict[str, Any] = {"type": error.kind, "message": error.message}
    if isinstance(error, _errors.ProviderError):
        record["status"] = error.status
        record["request_id"] = error.request_id
        if error.provider_type:
            record["provider_type"] = error.provider_type
    elif isinstance(error, _errors.InvalidOutputError):
        record["errors"] = list(error.errors)
        if error.generation:
            record["generation"] = error.generation
    return record


def error_from_record(record: Mapping[str, Any]) -> _errors.SluiceError:
    cls = _BY_KIND.get(str(record.get("type")), _errors.SluiceError)
    message = str(record.get("message", ""))
    if issubclass(cls, _errors.ProviderError):
        error = cls(message, provider_type=record.get("provider_type"))
        error.status = record.get("status")
        error.request_id = record.get("request_id")
        return error
    if issubclass(cls, _errors.InvalidOutputError):
        errors, generation = record.get("errors"), record.get("generation")
        return cls(
            message,
            [str(e) for e in errors] if isinstance(errors, list) else (),
            generation if isinstance(generation, int) and not isinstance(generation, bool) else 0,
        )
    return cls(message)


def result_record(result: Result) -> dict[str, Any]:
    """Everything a later run needs to hand this result back without sending again (and,
    for a request with a schema, its parsed answer and its re-asks)."""
    record: dict[str, Any] = {
        "ok": result.ok,
        "text": result.text,
        "error": error_record(result.error) if result.error is not None else None,
        "usage": usage_record(result.usage),
        "raw": result.raw,
        "attempts": result.attempts,
        "latency_s": round(result.timings.latency, 6),
        "deployment": result.deployment,
        "finish_reason": result.finish_reason,
        "request_id": result.request_id,
        "cost_usd": usd_record(result.cost_usd),
        "model": result.model,
        "tier": result.tier,
        "batch_id": result.batch_id,
    }
    schema = result.request.schema if result.request is not None else None
    if schema is not None:
        record["parsed"] = schema.to_json(result.parsed)
        record["reasks"] = result.reasks
        record["reask_cost_usd"] = usd_record(result.reask_cost_usd)
    return record


def _parsed(request: Request | None, record: Mapping[str, Any]) -> Any:
    """A stored answer's parsed value as ``Result.parsed`` gives it (a model instance for a
    model); None when the stored value no longer fits the schema (the schema's code changed)."""
    value = record.get("parsed")
    schema = request.schema if request is not None else None
    if value is None or schema is None:
        return value
    try:
        return schema.revive(value)
    except Exception:  # a model changed since the record was written: the record is still there
        return None


def result_from_record(request: Request | None, record: Mapping[str, Any], *, index: int | None = None) -> Result:
    usage = record.get("usage") or {}
    error = record.get("error")
    return Result(
        request,
        text=record.get("text"),
        error=error_from_record(error) if error else None,
        usage=Usage(**{k: int(v) for k, v in usage.items() if k in Usage.__dataclass_fields__}),
        raw=record.get("raw"),
        attempts=int(record.get("attempts") or 0),
        timings=Timings(latency=float(record.get("latency_s") or 0.0)),
        deployment=record.get("deployment"),
        finish_reason=record.get("finish_reason"),
        request_id=record.get("request_id"),
        index=index,
        cached=True,
        cost_usd=record.get("cost_usd"),
        model=record.get("model"),
        tier=record.get("tier"),
        batch_id=record.get("batch_id"),
        parsed=_parsed(request, record),
        reasks=int(record.get("reasks") or 0),
        reask_cost_usd=record.get("reask_cost_usd"),
    )
