"""What a job's entries carry between the coordinator and its workers: the request (as
JSON, nothing secret), the deployments' limits the coordinator shares, and the error
record of a dead letter. Pure functions, no Redis."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from .. import _json
from .._errors import SluiceError
from .._models import Deployment, Native, Price, Request
from .._records import error_from_record
from ..structured import schema_from_response_format

__all__ = [
    "SHARED_FIELDS",
    "dead_letter",
    "defaults_from_shared",
    "deployment_from_shared",
    "request_fields",
    "request_from_fields",
    "shared_defaults",
    "shared_deployment",
]

#: Deployment fields a coordinator may publish to workers: limits and prices, never a key
#: or a base URL.
SHARED_FIELDS = (
    "model",
    "name",
    "rpm",
    "tpm",
    "itpm",
    "otpm",
    "max_in_flight",
    "window",
    "burst_requests",
    "burst_tokens",
    "default_max_tokens",
    "weight",
    "price",
)


def request_fields(request: Request) -> str:
    """The request as an entry carries it: what the provider needs, nothing secret."""
    return _json.dumps_text(
        {
            "model": request.model,
            "messages": request.messages,
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
            "params": request.params,
            "id": request.id,
            "metadata": request.metadata,
            # a model class cannot travel: its JSON Schema does (the same digest, so the same key)
            "schema": request.schema.response_format() if request.schema is not None else None,
            # a body written for another API: a deployment of that API is sent it as it is
            "native": _native_fields(request.native),
        }
    )


def _native_fields(native: Native | None) -> dict[str, Any] | None:
    if native is None:
        return None
    return {"api": native.api, "body": native.body, "lost": list(native.lost)}


def request_from_fields(body: str | bytes) -> Request:
    data = json.loads(body)
    return Request(
        model=data["model"],
        messages=data["messages"],
        max_tokens=data.get("max_tokens"),
        temperature=data.get("temperature"),
        params=data.get("params") or {},
        id=data.get("id"),
        metadata=data.get("metadata") or {},
        schema=schema_from_response_format(data.get("schema")),
        native=Native(native["api"], native["body"], tuple(native["lost"])) if (native := data.get("native")) else None,
    )


def shared_deployment(deployment: Deployment) -> dict[str, Any]:
    """What workers may learn of a coordinator's deployment (see SHARED_FIELDS)."""
    fields: dict[str, Any] = {}
    for name in SHARED_FIELDS:
        value = getattr(deployment, name)
        if isinstance(value, Price):
            value = dataclasses.asdict(value)
        fields[name] = value
    return fields


def shared_defaults(defaults: Mapping[str, Any]) -> dict[str, Any]:
    return {k: dataclasses.asdict(v) if isinstance(v, Price) else v for k, v in defaults.items() if k in SHARED_FIELDS}


def deployment_from_shared(fields: Mapping[str, Any]) -> Deployment:
    values = {k: v for k, v in fields.items() if k in SHARED_FIELDS and v is not None}
    if isinstance(values.get("price"), Mapping):
        values["price"] = Price(**values["price"])
    return Deployment(**values)


def defaults_from_shared(fields: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Limits and prices only, as for deployments: whoever can write to Redis must not
    give a worker a base URL, a key variable or headers (its key would go there)."""
    if not fields:
        return None
    values = {k: v for k, v in fields.items() if k in SHARED_FIELDS and k not in ("model", "name") and v is not None}
    if not values:
        return None
    if isinstance(values.get("price"), Mapping):
        values["price"] = Price(**values["price"])
    return values


def dead_letter(deliveries: int, last: Mapping[str, Any] | None) -> SluiceError:
    """The error record of a request no worker could answer."""
    if last is None:
        return SluiceError(
            f"dead letter: delivered {deliveries} times and never answered (the workers that took it "
            "stopped first); a rerun of the coordinator sends it again"
        )
    error = error_from_record(last)
    error.message = f"dead letter: delivered {deliveries} times; last error: {error.message}"
    error.args = (error.message,)
    return error
