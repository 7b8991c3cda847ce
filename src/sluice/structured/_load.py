"""``--schema``'s argument made into a :class:`~._schema.Schema`: a JSON Schema file, or a
Pydantic model named ``module:Model`` (imported from the current directory too, as
``python -m`` would)."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

from .._errors import ConfigError, InvalidRequestError
from .._schema import Schema, schema_from_response_format

__all__ = ["load_schema"]


def load_schema(spec: str) -> Schema:
    """The Schema ``spec`` names; raises ConfigError saying what is wrong with it."""
    path = Path(spec)
    if path.suffix.lower() == ".json" or path.exists() or ":" not in spec:
        return _from_file(path)
    return _from_model(spec)


def _from_file(path: Path) -> Schema:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"--schema {path}: no such file (give a JSON Schema file, or module:Model)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--schema {path}: cannot be read: {exc}") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--schema {path}: not JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    if not isinstance(value, dict):
        raise ConfigError(f"--schema {path}: a JSON Schema is an object, got {type(value).__name__}")
    try:
        if value.get("type") in ("json_schema", "json_object") and ("json_schema" in value or len(value) == 1):
            schema = schema_from_response_format(value)  # OpenAI's response_format, as a line gives it
            assert schema is not None
            return schema
        return Schema(value, name=path.stem)
    except InvalidRequestError as exc:
        raise ConfigError(f"--schema {path}: {exc.message}") from None


def _from_model(spec: str) -> Schema:
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ConfigError(f"--schema {spec!r}: give a JSON Schema file, or module:Model")
    here = str(Path.cwd())
    added = here not in sys.path
    if added:
        sys.path.insert(0, here)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"--schema {spec}: cannot import {module_name!r}: {exc}") from None
    except Exception as exc:  # the module's own code failed
        raise ConfigError(f"--schema {spec}: importing {module_name!r} raised {type(exc).__name__}: {exc}") from None
    finally:
        if added:
            sys.path.remove(here)
    model: object = module
    for part in attribute.split("."):
        if not hasattr(model, part):
            raise ConfigError(f"--schema {spec}: {module_name!r} has no {attribute!r}")
        model = getattr(model, part)
    if not isinstance(model, type):
        raise ConfigError(f"--schema {spec}: {attribute!r} is not a class (give a Pydantic model)")
    try:
        return Schema(model)
    except InvalidRequestError as exc:
        raise ConfigError(f"--schema {spec}: {exc.message}") from None
