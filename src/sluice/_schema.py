"""The shape an answer must have: a JSON Schema, or a Pydantic model's, said once.

A :class:`Schema` is what ``Request(schema=...)``, ``engine.complete(..., schema=...)``,
``sluice run --schema`` and a line's ``response_format`` all become. It knows how to
ask for itself (:meth:`Schema.response_format`, OpenAI's shape: the Anthropic provider
translates it into a forced tool), how to check an answer against itself (see
:mod:`sluice.structured._check`), and what it adds to a request's store key
(:attr:`Schema.digest`), so the store and the cache tell two schemas apart.

A value, beside the other values (``Request.schema`` holds one): :mod:`sluice.structured`
asks with it, checks and re-asks above it, and the values never import that feature.

Validation is the job of well-kept validators: ``jsonschema`` for a JSON Schema,
Pydantic for a model. Both are imported on first use, not with ``import sluice``.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

from . import _json
from ._errors import InvalidRequestError

__all__ = ["ASK_MODES", "MAX_REASKS", "Schema", "schema_from_response_format"]

#: How a deployment may be asked for a schema's answer (``options = {structured = "..."}``,
#: checked with the deployment; what each means: :mod:`sluice.structured._ask`).
ASK_MODES = ("json_schema", "json_object", "prompt")

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

    __slots__ = ("_validator", "digest", "json_object", "json_schema", "model", "name", "regex", "strict")

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
            try:
                given: Any = schema.model_json_schema()
            except Exception as exc:  # a field type Pydantic cannot say as JSON Schema (a callable...)
                raise InvalidRequestError(f"schema: {schema.__name__} has no JSON Schema: {exc}") from None
            name = name or schema.__name__
        elif isinstance(schema, Mapping):
            given = schema
        else:
            raise InvalidRequestError(
                f"schema must be a JSON Schema (a dict) or a Pydantic model class, got {type(schema).__name__}"
            )
        try:
            canonical = _json.canonical(given)
        except (TypeError, ValueError) as exc:
            raise InvalidRequestError(f"schema is not plain JSON: {exc}") from None
        # its own copy (the caller's dict may change), in the given order: a model writes the
        # properties in the order the schema lists them (the digest is order-blind)
        json_schema: dict[str, Any] = json.loads(_json.dumps_text(given))
        _check_schema(json_schema)
        self.json_schema = json_schema
        self.json_object = json_object
        self.name = _name_of(name if name is not None else json_schema.get("title"))
        self.strict = strict_compatible(json_schema) if strict is None else bool(strict)
        self._validator: Any = None
        #: It holds regular expressions (``pattern``): a pathological one can take seconds on
        #: one answer, so such a schema is checked off the event loop.
        self.regex = b'"pattern' in canonical or b'"patternProperties"' in canonical
        # the name is left out: it does not change which answers are valid (a renamed file,
        # the same schema, is the same question)
        self.digest = hashlib.sha256(
            canonical + f"|strict={self.strict}|json_object={json_object}".encode()
        ).hexdigest()[:32]

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

    @property
    def object_rooted(self) -> bool:
        """Its top level can only be an object (what a tool's input must be)."""
        return self.json_object or self.json_schema.get("type") == "object"

    def validator(self) -> Any:
        """The JSON Schema validator for it (jsonschema's, for the schema's draft), made once."""
        if self._validator is None:
            self._validator = _validator_of(self.json_schema)
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


def _validator_of(schema: Mapping[str, Any]) -> Any:
    """jsonschema's validator for the schema's draft, with formats checked and an empty
    registry: a ``$ref`` is never fetched (an URL or a ``file://`` would be read, with no
    timeout, on the event loop, and what it held shown in errors and re-asks)."""
    from jsonschema import validators
    from referencing import Registry

    cls = validators.validator_for(schema)
    return cls(schema, registry=Registry(), format_checker=cls.FORMAT_CHECKER)


def _check_schema(schema: dict[str, Any]) -> None:
    """Refuse a schema that is not valid JSON Schema, saying where (the validator's own
    check); one whose ``$ref`` is not a local pointer that resolves; one whose references
    loop without end."""
    from jsonschema import exceptions, validators

    try:
        validators.validator_for(schema).check_schema(schema)
    except exceptions.SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(top)"
        raise InvalidRequestError(f"schema is not a valid JSON Schema at {where}: {exc.message}") from None
    except Exception as exc:  # a $schema the validator does not know
        raise InvalidRequestError(f"schema is not a valid JSON Schema: {exc}") from None
    for where, ref in _refs(schema, ""):
        if not _resolves(schema, ref):
            raise InvalidRequestError(
                f"schema: $ref {ref!r} at {where or '(top)'} is not a local reference that resolves "
                "(only '#' and '#/...' pointers into the schema itself are followed; nothing is fetched)"
            )
    try:
        probes: tuple[Any, ...] = (None, {}, [], "", 0)
        for probe in probes:
            for _ in _validator_of(schema).iter_errors(probe):
                pass
    except RecursionError:
        raise InvalidRequestError("schema: its $refs refer to each other without end") from None
    except Exception as exc:  # what the validator cannot take (a pattern that is not a regex...)
        raise InvalidRequestError(f"schema cannot be used to validate: {type(exc).__name__}: {exc}") from None


def _refs(node: Any, where: str) -> Any:
    """(path, $ref) for every reference in the schema."""
    if isinstance(node, Mapping):
        ref = node.get("$ref")
        if ref is not None:
            yield where, ref
        for key, value in node.items():
            if key not in ("const", "enum", "default", "examples"):  # values, not schemas
                yield from _refs(value, f"{where}/{key}" if where else str(key))
    elif isinstance(node, list):
        for n, value in enumerate(node):
            yield from _refs(value, f"{where}/{n}")


def _resolves(schema: Any, ref: object) -> bool:
    """Whether ``ref`` is ``#`` or a JSON pointer (``#/$defs/Name``) that exists in ``schema``."""
    if not isinstance(ref, str) or not ref.startswith("#") or (len(ref) > 1 and not ref.startswith("#/")):
        return False
    node = schema
    for raw in ref[2:].split("/") if len(ref) > 1 else ():
        part = unquote(raw).replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return False
    return True


#: Keywords OpenAI's strict mode refuses (its structured-outputs guide, "supported schemas").
_NOT_STRICT = frozenset(
    {"allOf", "oneOf", "not", "if", "then", "else", "dependentRequired", "dependentSchemas", "patternProperties"}
)


def strict_compatible(schema: Any) -> bool:
    """Whether OpenAI's strict mode takes the schema as it is: an object at the top (not an
    ``anyOf``), every object closed and all its properties required, no keyword strict mode
    refuses, no ``$ref`` beside other keywords. Otherwise strict would be refused with a
    400, or change what the schema means by making optional fields required."""
    if not isinstance(schema, Mapping) or schema.get("type") != "object" or "anyOf" in schema:
        return False
    return _strict_node(schema)


def _strict_node(schema: Any) -> bool:
    if isinstance(schema, list):
        return all(_strict_node(s) for s in schema)
    if not isinstance(schema, Mapping):
        return not isinstance(schema, bool)
    if _NOT_STRICT & set(schema) or ("$ref" in schema and len(schema) > 1):
        return False
    kinds = schema.get("type")
    if kinds == "object" or (isinstance(kinds, list) and "object" in kinds) or "properties" in schema:
        properties = schema.get("properties") or {}
        if schema.get("additionalProperties") is not False:
            return False
        if not isinstance(properties, Mapping) or set(schema.get("required") or ()) != set(properties):
            return False
    for key in ("properties", "$defs", "definitions"):
        nested = schema.get(key)
        if isinstance(nested, Mapping) and not all(_strict_node(s) for s in nested.values()):
            return False
    for key in ("items", "anyOf", "prefixItems"):
        nested = schema.get(key)
        if isinstance(nested, (Mapping, list)) and not _strict_node(nested):
            return False
    return True


#: Schemas made from lines' ``response_format``, by content: a batch file gives every line
#: the same one, and making one (checking it, its validator) costs ~20 ms; checking an
#: answer with it ~0.3 ms.
_MADE: dict[bytes, Schema] = {}
_MADE_MAX = 256


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
        return _json_object()
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
    try:
        seen = _json.canonical([spec["schema"], name, strict])
    except (TypeError, ValueError) as exc:
        raise InvalidRequestError(f"{where}.json_schema.schema is not plain JSON: {exc}") from None
    made = _MADE.get(seen)
    if made is None:
        # strict as the line says (OpenAI's default is off): a line that worked before
        # sluice validated it must not be refused for a strictness it never asked for
        made = Schema(spec["schema"], name=name, strict=bool(strict))
        if len(_MADE) >= _MADE_MAX:
            _MADE.pop(next(iter(_MADE)))
        _MADE[seen] = made
    return made


_JSON_OBJECT: list[Schema] = []


def _json_object() -> Schema:
    """``{"type": "json_object"}``'s Schema, made on first use (not with ``import sluice``)."""
    if not _JSON_OBJECT:
        _JSON_OBJECT.append(Schema({"type": "object"}, name="json_object", json_object=True))
    return _JSON_OBJECT[0]
