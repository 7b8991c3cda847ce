"""The shape an answer must have: a JSON Schema, or a Pydantic model's, said once.

A :class:`Schema` is what ``Request(schema=...)``, ``engine.complete(..., schema=...)``,
``sluice run --schema`` and a line's ``response_format`` all become. It knows how to
ask for itself (:meth:`Schema.response_format`, OpenAI's shape: the Anthropic provider
translates it into a forced tool), how to check an answer against itself (see
:mod:`._check`), and what it adds to a request's store key (:attr:`Schema.digest`), so
the store and the cache tell two schemas apart.

Validation is the job of well-kept validators: ``jsonschema`` for a JSON Schema,
Pydantic for a model. Both are imported on first use, not with ``import sluice``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any

from .. import _json
from .._errors import InvalidRequestError

__all__ = ["MAX_REASKS", "Schema", "schema_from_response_format"]

#: Re-asks of an invalid answer by default: a model whose answers are invalid one time in
#: five then leaves a line invalid with p = 0.2**6 (6e-5; every line of a 500-line job valid
#: 97 % of the time, against 45 % with 3), while one that cannot answer the schema at all
#: costs at most 6 asks a line, each reserved against the budget first.
MAX_REASKS = 5

#: OpenAI's rule for ``json_schema.name`` (and a tool's name, on Anthropic).
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


class Schema:
    """An answer's required shape (see the module docstring).

    ``schema`` is a JSON Schema (a mapping) or a Pydantic model class; ``name`` is what
    the provider is told it is called; ``strict`` asks OpenAI for constrained decoding,
    and is on by default only where the schema allows it (every object closed with
    ``additionalProperties: false`` and all its properties required, as OpenAI's strict
    mode demands). ``json_object`` asks only for some JSON object (OpenAI's
    ``{"type": "json_object"}``).
    """

    __slots__ = ("_validator", "digest", "json_object", "json_schema", "model", "name", "strict")

    def __init__(
        self,
        schema: Mapping[str, Any] | type[Any],
        *,
        name: str | None = None,
        strict: bool | None = None,
        json_object: bool = False,
    ) -> None:
        self.model: type[Any] | None = None
        if isinstance(schema, type):
            if not (hasattr(schema, "model_json_schema") and hasattr(schema, "model_validate")):
                raise InvalidRequestError(
                    f"schema: {schema.__name__} is a class but not a Pydantic model; give a "
                    "pydantic.BaseModel subclass or a JSON Schema (a dict)"
                )
            self.model = schema
            json_schema: Mapping[str, Any] = schema.model_json_schema()
            name = name or schema.__name__
        elif isinstance(schema, Mapping):
            json_schema = schema
        else:
            raise InvalidRequestError(
                f"schema must be a JSON Schema (a dict) or a Pydantic model class, got {type(schema).__name__}"
            )
        _check_schema(json_schema)
        self.json_schema = json_schema
        self.json_object = json_object
        self.name = _name_of(name if name is not None else json_schema.get("title"))
        self.strict = strict_compatible(json_schema) if strict is None else bool(strict)
        self._validator: Any = None
        canonical = _json.canonical(
            {"schema": json_schema, "name": self.name, "strict": self.strict, "json_object": json_object}
        )
        self.digest = hashlib.sha256(canonical).hexdigest()[:32]

    @classmethod
    def of(cls, value: Schema | Mapping[str, Any] | type[Any]) -> Schema:
        return value if isinstance(value, Schema) else cls(value)

    def response_format(self) -> dict[str, Any]:
        """How OpenAI's Chat Completions API is asked for it."""
        if self.json_object:
            return {"type": "json_object"}
        spec: dict[str, Any] = {"name": self.name, "schema": dict(self.json_schema), "strict": self.strict}
        description = self.json_schema.get("description")
        if isinstance(description, str):
            spec["description"] = description
        return {"type": "json_schema", "json_schema": spec}

    def instruction(self) -> str:
        """The schema said in words, for a server that cannot be asked for it any other way."""
        if self.json_object:
            return "Answer with a single JSON object and nothing else: no prose, no markdown."
        return (
            "Answer with a single JSON value that matches this JSON Schema, and nothing else "
            f"(no prose, no markdown):\n{_json.dumps_text(self.json_schema)}"
        )

    def validator(self) -> Any:
        """The JSON Schema validator for it (jsonschema's, for the schema's draft), made once."""
        if self._validator is None:
            from jsonschema import validators

            self._validator = validators.validator_for(self.json_schema)(self.json_schema)
        return self._validator

    def to_json(self, parsed: Any) -> Any:
        """A validated answer as plain JSON (a Pydantic instance dumped), for a record."""
        if self.model is not None and hasattr(parsed, "model_dump"):
            return parsed.model_dump(mode="json")
        return parsed

    def revive(self, value: Any) -> Any:
        """A recorded answer as :attr:`Result.parsed` hands it out: a model instance for a
        model (it was valid when recorded), the JSON itself otherwise."""
        if self.model is not None and value is not None:
            return self.model.model_validate(value)
        return value

    def __repr__(self) -> str:
        what = self.model.__name__ if self.model is not None else "json_object" if self.json_object else "JSON Schema"
        return f"Schema({self.name!r}, {what}, strict={self.strict})"


def _name_of(name: object) -> str:
    """A name OpenAI accepts: the given one, cleaned, or ``answer``."""
    if not isinstance(name, str) or not name.strip():
        return "answer"
    cleaned = re.sub(r"[^A-Za-z0-9_-]+", "_", name.strip()).strip("_")[:64]
    return cleaned if _NAME.fullmatch(cleaned) else "answer"


def _check_schema(schema: Mapping[str, Any]) -> None:
    """Refuse a schema that is not valid JSON Schema, saying where (the validator's own check)."""
    from jsonschema import exceptions, validators

    try:
        validators.validator_for(schema).check_schema(dict(schema))
    except exceptions.SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(top)"
        raise InvalidRequestError(f"schema is not a valid JSON Schema at {where}: {exc.message}") from None
    except Exception as exc:  # a $schema the validator does not know, a value that is not JSON
        raise InvalidRequestError(f"schema is not a valid JSON Schema: {exc}") from None
    try:
        _json.canonical(schema)
    except (TypeError, ValueError) as exc:
        raise InvalidRequestError(f"schema is not plain JSON: {exc}") from None


def strict_compatible(schema: Any) -> bool:
    """Whether OpenAI's strict mode can take the schema as it is: every object closed and
    all its properties required (strict mode would otherwise refuse it, or change what
    it means by making optional fields required)."""
    if isinstance(schema, list):
        return all(strict_compatible(s) for s in schema)
    if not isinstance(schema, Mapping):
        return True
    kinds = schema.get("type")
    is_object = kinds == "object" or (isinstance(kinds, list) and "object" in kinds) or "properties" in schema
    if is_object:
        properties = schema.get("properties") or {}
        if schema.get("additionalProperties") is not False:
            return False
        if not isinstance(properties, Mapping) or set(schema.get("required") or ()) != set(properties):
            return False
    for key in ("properties", "$defs", "definitions", "patternProperties"):
        nested = schema.get(key)
        if isinstance(nested, Mapping) and not all(strict_compatible(s) for s in nested.values()):
            return False
    for key in ("items", "anyOf", "allOf", "oneOf", "prefixItems", "not", "additionalProperties"):
        nested = schema.get(key)
        if isinstance(nested, (Mapping, list)) and not strict_compatible(nested):
            return False
    return True


def schema_from_response_format(value: Any, where: str = "response_format") -> Schema | None:
    """The Schema a ``response_format`` (as OpenAI writes it) asks for; None for ``text``.
    Raises InvalidRequestError, saying what is wrong, for one that is not OpenAI's shape."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidRequestError(f"{where} must be an object such as {{'type': 'json_schema', ...}}")
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return Schema({"type": "object"}, name="json_object", json_object=True)
    if kind != "json_schema":
        raise InvalidRequestError(f"{where}.type must be 'json_schema', 'json_object' or 'text', got {kind!r}")
    spec = value.get("json_schema")
    if not isinstance(spec, Mapping) or not isinstance(spec.get("schema"), Mapping):
        raise InvalidRequestError(f"{where}.json_schema.schema must be a JSON Schema object")
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise InvalidRequestError(f"{where}.json_schema.strict must be true or false, got {strict!r}")
    name = spec.get("name")
    if name is not None and not (isinstance(name, str) and _NAME.fullmatch(name)):
        raise InvalidRequestError(f"{where}.json_schema.name must match [A-Za-z0-9_-]{{1,64}}, got {name!r}")
    return Schema(spec["schema"], name=name, strict=strict)
