"""Structured answers: JSON made from the request's own schema, and the invalid ones models give.

A request that asks for JSON (OpenAI ``response_format`` ``json_schema`` / ``json_object``,
or ``text.format`` in the Responses API; Anthropic a forced tool, ``tool_choice:
{"type": "tool", "name": ...}``) is answered
with an instance of its schema, built here from the schema alone (the fake shares no
code with sluice's validator, so a wrong assumption in either shows). It can be told to
answer invalidly, as real models do, at a rate or for the first N asks of each prompt
(an ask is identified by its model and first user message, so a re-ask, which appends
to the conversation, counts as the same prompt's next ask):

=========== ======================================================================
prose       text that is not JSON ("Sure! Here is ...")
cut         the JSON cut in half, ``finish_reason: length`` / ``stop_reason: max_tokens``
fenced      the JSON inside a markdown code fence (valid once the fence is taken off)
missing     the first required property left out
wrong_type  the first property given a value of another JSON type
=========== ======================================================================
"""

from __future__ import annotations

import hashlib
import json
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from ._formats import anthropic_output_usage

if TYPE_CHECKING:
    from ._formats import Call, Format

__all__ = ["INVALID_KINDS", "StructuredAnswers", "StructuredAsk"]

INVALID_KINDS = ("prose", "cut", "fenced", "missing", "wrong_type")
_PROSE = "Sure! Here is the information you asked for, in a few words rather than JSON."


class StructuredAsk(NamedTuple):
    """What a request asked for: its schema, and the forced tool's name on Anthropic."""

    schema: Mapping[str, Any]
    tool: str | None
    prompt: str
    body: Mapping[str, Any]


class StructuredAnswers:
    """The fake's structured answers and the invalid ones it is told to give (see the module)."""

    def __init__(self, seed: int | None = None) -> None:
        #: Share of structured asks answered invalidly (kind drawn from :attr:`kinds`).
        self.invalid_rate = 0.0
        #: The first N asks of every prompt are answered invalidly.
        self.invalid_first = 0
        self.kinds: tuple[str, ...] = INVALID_KINDS
        #: Structured asks answered, and the invalid answers given, by kind.
        self.asked = 0
        self.given: Counter[str] = Counter()
        #: The body of the latest structured ask (tests read what a re-ask said).
        self.last_body: Mapping[str, Any] | None = None
        self._asks: Counter[str] = Counter()
        self._rng = random.Random(seed)

    def configure(self, *, rate: float = 0.0, first: int = 0, kinds: Sequence[str] | None = None) -> None:
        unknown = [k for k in kinds or () if k not in INVALID_KINDS]
        if unknown or not 0.0 <= rate <= 1.0 or first < 0:
            raise ValueError(f"invalid answers: rate in [0, 1], first >= 0, kinds of {INVALID_KINDS}")
        self.invalid_rate, self.invalid_first = rate, first
        self.kinds = tuple(kinds) if kinds else INVALID_KINDS

    def ask_of(self, body: Any, api: str) -> StructuredAsk | None:
        """The structured ask a request body makes (``api``: a Format's), or None."""
        if not isinstance(body, Mapping):
            return None
        prompt = _prompt_key(body)
        if api == "anthropic":
            choice, tools = body.get("tool_choice"), body.get("tools")
            if not (isinstance(choice, Mapping) and choice.get("type") == "tool" and isinstance(tools, list)):
                return None
            for tool in tools:
                if isinstance(tool, Mapping) and tool.get("name") == choice.get("name"):
                    schema = tool.get("input_schema")
                    return StructuredAsk(schema if isinstance(schema, Mapping) else {}, str(tool["name"]), prompt, body)
            return None
        fmt = body.get("response_format")
        if api == "responses":
            text = body.get("text")
            fmt = text.get("format") if isinstance(text, Mapping) else None
        if not isinstance(fmt, Mapping):
            return None
        if fmt.get("type") == "json_object":
            return StructuredAsk({"type": "object", "properties": {"answer": {"type": "string"}}}, None, prompt, body)
        spec = fmt if api == "responses" else fmt.get("json_schema")  # Responses' text.format is flat
        if fmt.get("type") == "json_schema" and isinstance(spec, Mapping) and isinstance(spec.get("schema"), Mapping):
            return StructuredAsk(spec["schema"], None, prompt, body)
        return None

    def answer(self, ask: StructuredAsk) -> tuple[Any, str | None]:
        """(the answer's value, the invalid kind given or None). A value that is a str is
        the answer's text as it is; anything else is JSON to encode."""
        self.asked += 1
        self.last_body = ask.body
        self._asks[ask.prompt] += 1
        value = instance(ask.schema, ask.schema)
        kind = None
        if self._asks[ask.prompt] <= self.invalid_first or (
            self.invalid_rate and self._rng.random() < self.invalid_rate
        ):
            kind = self._rng.choice(self.kinds)
        if kind is None:
            return value, None
        self.given[kind] += 1
        return _spoiled(value, ask.schema, kind), kind


def _prompt_key(body: Mapping[str, Any]) -> str:
    given = body.get("input")  # Responses: a string (a user message) or items
    messages = [{"role": "user", "content": given}] if isinstance(given, str) else given or body.get("messages")
    first = next(
        (m.get("content") for m in messages or () if isinstance(m, Mapping) and m.get("role") == "user"),
        None,
    )
    raw = json.dumps([body.get("model"), first], sort_keys=True, default=str)
    return hashlib.sha256(raw.encode()).hexdigest()


def _spoiled(value: Any, schema: Mapping[str, Any], kind: str) -> Any:
    """``value`` made invalid the way ``kind`` says (see the module docstring)."""
    text = json.dumps(value)
    if kind == "prose":
        return _PROSE
    if kind == "cut":
        return _Cut(text[: max(1, len(text) // 2)])
    if kind == "fenced":
        return f"```json\n{text}\n```"
    if not isinstance(value, dict) or not value:
        return _PROSE
    spoiled = dict(value)
    if kind == "missing":
        required = [k for k in schema.get("required") or () if k in spoiled] or list(spoiled)
        del spoiled[required[0]]
        return spoiled
    name = next(iter(spoiled))
    spoiled[name] = 12345 if isinstance(spoiled[name], str) else "a value of the wrong type"
    return spoiled


class _Cut(str):
    """An answer's text cut off at max_tokens."""


def render(fmt: Format, n: int, call: Call, completion: int, value: Any, ask: StructuredAsk, created: int) -> bytes:
    """The 200 body of a structured answer: the JSON as the message's text on OpenAI; on
    Anthropic a ``tool_use`` block of the forced tool (its input the answer), or a text
    block for an answer that is not an object (prose)."""
    cut = isinstance(value, _Cut)
    if ask.tool is None or (isinstance(value, str) and not cut):
        text = value if isinstance(value, str) else json.dumps(value)
        return fmt.success(n, call._replace(text=text), completion, cut, created)
    if cut:  # a tool input cut off: the part that was complete
        value = {}
    body = {
        "id": f"msg_{n}",
        "type": "message",
        "role": "assistant",
        "model": call.model,
        "content": [{"type": "tool_use", "id": f"toolu_{n}", "name": ask.tool, "input": value}],
        "stop_reason": "max_tokens" if cut else "tool_use",
        "stop_sequence": None,
        "usage": anthropic_output_usage(call, completion),
    }
    return json.dumps(body).encode()


def streamed_text(value: Any) -> str:
    """A structured answer's text, for a stream (OpenAI's: the content deltas)."""
    return value if isinstance(value, str) else json.dumps(value)


def instance(schema: Any, root: Mapping[str, Any], depth: int = 0) -> Any:
    """A value that matches ``schema`` (the keywords models' schemas use; ``$ref`` to
    ``#/$defs`` or ``#/definitions``)."""
    if not isinstance(schema, Mapping) or depth > 12:
        return None
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        target: Any = root
        for part in ref[2:].split("/"):
            target = target.get(part) if isinstance(target, Mapping) else None
        return instance(target, root, depth + 1)
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            chosen = next((o for o in options if isinstance(o, Mapping) and o.get("type") != "null"), options[0])
            return instance(chosen, root, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        kind = "object" if "properties" in schema else "array" if "items" in schema else "string"
    return _of_type(kind, schema, root, depth)


def _of_type(kind: str, schema: Mapping[str, Any], root: Mapping[str, Any], depth: int) -> Any:
    if kind == "object":
        properties = schema.get("properties") or {}
        return {name: instance(sub, root, depth + 1) for name, sub in properties.items()}
    if kind == "array":
        count = max(1, int(schema.get("minItems") or 1))
        return [instance(schema.get("items") or {}, root, depth + 1) for _ in range(count)]
    if kind == "integer":
        low = schema.get("minimum", schema.get("exclusiveMinimum", 0))
        return int(low) + (1 if "exclusiveMinimum" in schema else 0) if isinstance(low, (int, float)) else 1
    if kind == "number":
        low = schema.get("minimum", schema.get("exclusiveMinimum", 0))
        return float(low) + 0.5 if isinstance(low, (int, float)) else 0.5
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    formats = {"date": "2026-01-31", "date-time": "2026-01-31T12:00:00Z", "email": "someone@example.com"}
    text = formats.get(str(schema.get("format")), "text")
    return text + "x" * max(0, int(schema.get("minLength") or 0) - len(text))
