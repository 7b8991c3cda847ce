"""Answers that parse (``Request(schema=...)``), in the library, against the fake provider:
it answers JSON built from the request's own schema (its own generator, not sluice's), and
gives the invalid answers real models give (prose, cut off, fenced, a field missing, a
wrong type) when told to. What is checked: the answer sluice calls valid is valid by an
independent check, re-asks are real attempts (reserved, billed, retried, each with its own
Idempotency-Key), a budget stops them before it is exceeded, the Anthropic path
round-trips through a forced tool, and a schema is part of the store key."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from pydantic import BaseModel

from sluice import Deployment, Engine, InvalidRequestError, Request, RetryPolicy
from sluice.store import SqliteStore
from sluice.structured import MAX_REASKS, Schema, check
from sluice.testing import FakeServer

PRICE = {"input_per_mtok": 1.0, "output_per_mtok": 2.0}
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


class Person(BaseModel):
    name: str
    age: int


def _engine(server: FakeServer, provider: str = "openai", **engine: Any) -> Engine:
    url = server.url if provider == "openai" else server.anthropic_url
    options = engine.pop("options", {})
    deployment = Deployment(f"{provider}/m", base_url=url, api_key="sk-test", price=PRICE, options=options)
    engine.setdefault("retry", RetryPolicy(max_attempts=3, base_delay=0.01, max_delay=0.02))
    return Engine([deployment], **engine)


@contextlib.asynccontextmanager
async def _stored(server: FakeServer, state: Path, **engine: Any) -> AsyncIterator[Engine]:
    """An engine on a state file of its own, which is closed after it (an engine does not
    close a store it was given)."""
    store = SqliteStore(state)
    try:
        async with _engine(server, store=store, **engine) as running:
            yield running
    finally:
        store.close()


@pytest.fixture
async def server() -> Any:
    fake = FakeServer(api_key="sk-test", prices={"*": (1.0, 2.0)}, seed=7)
    async with fake:
        yield fake


# -- a valid answer, said once ------------------------------------------------------------------


async def test_a_json_schema_answer_is_parsed_and_valid(server: FakeServer) -> None:
    async with _engine(server) as engine:
        result = await engine.complete("openai/m", "who is it?", schema=PERSON)
    assert result.ok, result.error
    jsonschema.validate(result.parsed, PERSON)  # valid by a check of the test's own
    assert result.parsed == json.loads(result.text or "")
    assert (result.reasks, result.attempts) == (0, 1)
    sent = server.structured.last_body
    assert sent is not None
    assert sent["response_format"]["type"] == "json_schema"
    assert sent["response_format"]["json_schema"]["strict"] is True  # closed and all required: strict


async def test_a_pydantic_model_gives_an_instance(server: FakeServer) -> None:
    async with _engine(server) as engine:
        result = await engine.complete("openai/m", "who?", schema=Person)
    assert isinstance(result.parsed, Person)
    sent = server.structured.last_body
    assert sent is not None
    assert sent["response_format"]["json_schema"]["name"] == "Person"
    assert sent["response_format"]["json_schema"]["strict"] is False  # pydantic leaves objects open


async def test_a_fenced_answer_is_taken_without_a_reask(server: FakeServer) -> None:
    server.structured.configure(first=1, kinds=["fenced"])
    async with _engine(server) as engine:
        result = await engine.complete("openai/m", "who?", schema=PERSON)
    assert result.text is not None
    assert result.text.startswith("```json")
    assert result.ok
    assert result.reasks == 0
    assert result.attempts == 1
    jsonschema.validate(result.parsed, PERSON)


@pytest.mark.parametrize("kind", ["prose", "missing", "wrong_type"])
async def test_an_invalid_answer_is_shown_back_with_what_is_wrong(server: FakeServer, kind: str) -> None:
    server.structured.configure(first=1, kinds=[kind])
    async with _engine(server) as engine:
        result = await engine.complete("openai/m", "who?", schema=PERSON)
    assert result.ok, result.error
    jsonschema.validate(result.parsed, PERSON)
    assert (result.reasks, result.attempts) == (1, 2)
    assert server.structured.given[kind] == 1
    reasked = server.structured.last_body
    assert reasked is not None
    *_, answer, correction = reasked["messages"]
    assert answer["role"] == "assistant"
    assert answer["content"]
    assert correction["role"] == "user"
    assert "does not match the required JSON schema" in correction["content"]
    assert len(server.stats.by_key) == 2  # the re-ask had an Idempotency-Key of its own
    assert result.cost_usd == pytest.approx(server.total_billed_usd, rel=1e-9)  # both asks billed, both counted
    assert result.reask_cost_usd is not None
    assert 0 < result.reask_cost_usd < result.cost_usd


async def test_an_answer_cut_at_max_tokens_is_asked_again_with_twice_the_room(server: FakeServer) -> None:
    server.structured.configure(first=1, kinds=["cut"])
    async with _engine(server) as engine:
        result = await engine.complete("openai/m", "who?", schema=PERSON, max_tokens=40)
    assert result.ok
    assert result.reasks == 1
    again = server.structured.last_body
    assert again is not None
    assert again["max_tokens"] == 80
    assert len(again["messages"]) == 1  # asked as it was, not argued with
    assert result.usage.output_tokens == 2 * 16  # both answers' tokens


async def test_still_invalid_after_its_reasks_is_invalid_output(server: FakeServer) -> None:
    server.structured.configure(rate=1.0, kinds=["wrong_type"])
    async with _engine(server, max_reasks=2) as engine:
        result = await engine.complete("openai/m", "who?", schema=PERSON)
    assert not result.ok
    assert result.error is not None
    assert result.error.kind == "invalid_output"
    assert "after 2 re-asks" in result.error.message
    assert any("$.name" in e for e in result.error.errors)  # type: ignore[attr-defined]
    assert (result.reasks, result.attempts, server.stats.received) == (2, 3, 3)
    assert result.text is not None
    assert "12345" in result.text
    assert result.parsed is None
    assert result.cost_usd == pytest.approx(server.total_billed_usd, rel=1e-9)


async def test_max_reasks_zero_asks_once(server: FakeServer) -> None:
    server.structured.configure(rate=1.0, kinds=["prose"])
    async with _engine(server, max_reasks=0) as engine:
        result = await engine.complete("openai/m", "who?", schema=PERSON)
    assert result.error is not None
    assert result.error.kind == "invalid_output"
    assert server.stats.received == 1
    assert result.reasks == 0


async def test_a_reask_that_fails_is_retried_on_its_own_attempts(server: FakeServer) -> None:
    """Each ask has the whole retry policy: a 500 on the re-ask is retried, not counted
    against the first ask's attempts."""
    server.structured.configure(first=1, kinds=["missing"])
    async with _engine(server) as engine:  # max_attempts=3
        server.on_arrival = lambda headers: server.inject("500", times=2) if server.stats.received == 1 else None
        result = await engine.complete("openai/m", "who?", schema=PERSON)
    assert result.ok, result.error
    assert result.reasks == 1
    assert result.attempts == 4


# -- money ------------------------------------------------------------------------------------


async def test_a_budget_stops_reasks_before_it_is_exceeded(server: FakeServer) -> None:
    """Each re-ask reserves its worst case first: the one the money left cannot cover is
    not sent, and the line ends invalid, saying so."""
    server.structured.configure(rate=1.0, kinds=["missing"])
    ask = Request.from_prompt("openai/m", "who?", max_tokens=64, schema=PERSON)
    async with _engine(server) as probe:
        worst = probe.spending.worst_cost(ask, probe.deployments[0])
    budget = 4 * worst  # re-asks grow (the answer and the correction go with them): a few fit, not six
    async with _engine(server, budget_usd=budget, max_reasks=5) as engine:
        result = await engine.complete(ask)
        assert engine.spending.budget is not None
        spent = engine.spending.budget.spent()
    assert result.error is not None
    assert result.error.kind == "budget_exhausted"  # the money, not the model: exit 4, a rerun with more
    assert "no further re-ask was made" in result.error.message
    assert "budget" in result.error.message
    assert 2 <= server.stats.received < 6  # stopped by money, not by max_reasks
    assert result.reasks == server.stats.received - 1
    assert server.total_billed_usd <= budget
    assert spent == pytest.approx(server.total_billed_usd, rel=1e-9)


# -- each provider its way -------------------------------------------------------------------------


async def test_the_anthropic_path_forces_a_tool_and_reads_its_input_back(server: FakeServer) -> None:
    server.structured.configure(first=1, kinds=["missing"])
    async with _engine(server, "anthropic") as engine:
        result = await engine.complete("anthropic/m", "who?", schema=PERSON)
    assert result.ok, result.error
    jsonschema.validate(result.parsed, PERSON)
    assert result.reasks == 1
    sent = server.structured.last_body
    assert sent is not None
    assert "response_format" not in sent
    assert sent["tool_choice"]["type"] == "tool"
    (tool,) = [t for t in sent["tools"] if t["name"] == sent["tool_choice"]["name"]]
    assert tool["input_schema"]["required"] == ["name", "age"]


async def test_a_server_without_schema_support_is_told_in_words(server: FakeServer) -> None:
    async with _engine(server, options={"structured": "prompt"}) as engine:
        result = await engine.complete("openai/m", "who?", schema=PERSON)
    sent = server.structured.last_body
    # the fake answers JSON only when asked by response_format: told in words, it answers prose
    assert sent is None
    assert result.error is not None
    assert result.error.kind == "invalid_output"
    assert server.stats.received == MAX_REASKS + 1


async def test_json_object_mode_says_the_schema_in_a_system_message(server: FakeServer) -> None:
    async with _engine(server, options={"structured": "json_object"}) as engine:
        result = await engine.complete("openai/m", "who?", schema=PERSON)
    sent = server.structured.last_body
    assert sent is not None
    assert sent["response_format"] == {"type": "json_object"}
    assert sent["messages"][0]["role"] == "system"
    assert '"required":["name","age"]' in sent["messages"][0]["content"]
    assert result.attempts >= 1


# -- the schema itself ----------------------------------------------------------------------------


def test_a_schema_that_is_not_json_schema_is_refused_saying_where() -> None:
    with pytest.raises(InvalidRequestError, match=r"not a valid JSON Schema at properties/age"):
        Request.from_prompt("m", "hi", schema={"type": "object", "properties": {"age": {"type": "integr"}}})
    with pytest.raises(InvalidRequestError, match="not a Pydantic model"):
        Request.from_prompt("m", "hi", schema=dict)
    with pytest.raises(InvalidRequestError, match="once"):
        Request.from_prompt("m", "hi", schema=PERSON, params={"response_format": {"type": "json_object"}})


def test_the_schema_is_part_of_the_request_key() -> None:
    from sluice import request_key

    plain = Request.from_prompt("m", "hi")
    person = Request.from_prompt("m", "hi", schema=PERSON)
    model = Request.from_prompt("m", "hi", schema=Person)
    assert len({request_key(plain), request_key(person), request_key(model)}) == 3
    assert request_key(person) == request_key(Request.from_prompt("m", "hi", schema=dict(PERSON)))


async def test_a_stored_answer_comes_back_parsed_as_the_model(server: FakeServer, tmp_path: Path) -> None:
    state = tmp_path / "state.db"
    async with _stored(server, state) as engine:
        first = await engine.complete("openai/m", "who?", schema=Person)
    async with _stored(server, state) as engine:
        again = await engine.complete("openai/m", "who?", schema=Person)
        other = await engine.complete("openai/m", "who?", schema=PERSON)  # another schema: sent
    assert again.cached
    assert isinstance(again.parsed, Person)
    assert again.parsed == first.parsed
    assert not other.cached
    assert server.stats.received == 2


async def test_a_stored_invalid_output_is_asked_again_by_a_rerun(server: FakeServer, tmp_path: Path) -> None:
    state = tmp_path / "state.db"
    server.structured.configure(rate=1.0, kinds=["prose"])
    async with _stored(server, state, max_reasks=1) as engine:
        failed = await engine.complete("openai/m", "who?", schema=PERSON)
    server.structured.configure()
    async with _stored(server, state) as engine:
        mended = await engine.complete("openai/m", "who?", schema=PERSON)
    assert failed.error is not None
    assert failed.error.kind == "invalid_output"
    assert mended.ok
    assert not mended.cached


async def test_a_schema_cannot_be_streamed(server: FakeServer) -> None:
    async with _engine(server) as engine:
        with pytest.raises(InvalidRequestError, match="cannot be streamed"):
            engine.stream("openai/m", "who?", schema=PERSON)


def test_check_tolerates_only_whitespace_and_one_fence() -> None:
    schema = Schema(PERSON)
    good = '{"name": "a", "age": 3}'
    assert check(schema, f"  \n```json\n{good}\n```\n", "stop").ok
    assert check(schema, f"```\n{good}\n```", "stop").ok
    assert not check(schema, f"Here you go: {good}", "stop").ok
    assert not check(schema, f"```json\n{good}\n```\nHope this helps!", "stop").ok
    cut = check(schema, good[:10], "length")
    assert cut.truncated
    assert not cut.ok
    assert check(schema, '{"name": "a", "age": -1}', "stop").errors == ("$.age: -1 is less than the minimum of 0",)


def test_the_sync_api_takes_a_schema() -> None:
    import sluice

    results = sluice.run(["one", "two"], model="simulate/demo", schema=Person)
    assert all(isinstance(r.parsed, Person) for r in results), [r.error for r in results]


# -- hostile schemas and answers -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("schema", "said"),
    [
        ({"$ref": "#/$defs/Typo", "$defs": {"Person": PERSON}}, "'#/$defs/Typo' at (top) is not a local reference"),
        ({"type": "object", "properties": {"a": {"$ref": "http://127.0.0.1:9/x"}}}, "at properties/a"),
        ({"$ref": "file:///etc/passwd"}, "nothing is fetched"),
        ({"allOf": [{"$ref": "#"}]}, "refer to each other without end"),
        ({"type": "string", "pattern": "("}, "at pattern: '(' is not a 'regex'"),
    ],
)
def test_a_schema_whose_refs_do_not_resolve_locally_is_refused(schema: dict[str, Any], said: str) -> None:
    with pytest.raises(InvalidRequestError, match="schema") as refused:
        Schema(schema)
    assert said in refused.value.message


def test_answers_that_are_not_plain_json_are_invalid_not_a_crash() -> None:
    schema = Schema({"type": "object", "properties": {"score": {"type": "number", "maximum": 1}}})
    assert "NaN is not a JSON number" in check(schema, '{"score": NaN}', "stop").errors[0]
    assert not check(schema, '{"score": -Infinity}', "stop").ok
    assert "appears twice" in check(schema, '{"score": 0.1, "score": 0.9}', "stop").errors[0]
    deep = check(schema, "[" * 5000 + "]" * 5000, "stop")
    assert not deep.ok
    assert deep.broken is None  # the answer's fault: re-asked


async def test_a_models_validator_that_raises_ends_the_line_not_the_job(server: FakeServer) -> None:
    from pydantic import field_validator

    class Fragile(BaseModel):
        name: str

        @field_validator("name")
        @classmethod
        def explode(cls, value: str) -> str:
            raise KeyError("a bug in the user's validator")

    async with _engine(server) as engine:
        results = [
            r async for r in engine.map([Request.from_prompt("openai/m", f"q{i}", schema=Fragile) for i in range(3)])
        ]
    assert [r.error.kind if r.error else None for r in results] == ["invalid_request"] * 3
    assert all("KeyError" in (r.error.message if r.error else "") for r in results)
    assert server.stats.received == 3  # asked once each: asking again cannot mend the schema's code


def test_a_schema_cannot_go_with_tools() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    with pytest.raises(InvalidRequestError, match="cannot go with tools"):
        Request.from_prompt("m", "hi", schema=PERSON, params={"tools": tools})


def test_strict_is_asked_for_only_where_openai_takes_it() -> None:
    from sluice.structured import schema_from_response_format, strict_compatible

    assert strict_compatible(PERSON)
    for not_strict in (
        {"type": "array", "items": PERSON},
        {"anyOf": [PERSON, {"type": "null"}]},
        {**PERSON, "properties": {"name": {"allOf": [{"type": "string"}]}, "age": {"type": "integer"}}},
        {**PERSON, "properties": {"name": {"$ref": "#/$defs/n", "description": "x"}, "age": {"type": "integer"}}},
        {**PERSON, "required": ["name"]},
    ):
        assert not strict_compatible(not_strict), not_strict
    said = schema_from_response_format({"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}})
    assert said is not None
    assert said.strict is False  # the line left strict out: OpenAI's default, not ours


async def test_a_rerun_of_an_invalid_line_asks_with_new_idempotency_keys(server: FakeServer, tmp_path: Path) -> None:
    state = tmp_path / "state.db"
    server.structured.configure(rate=1.0, kinds=["prose"])
    for _ in range(2):
        async with _stored(server, state, max_reasks=1) as engine:
            result = await engine.complete("openai/m", "who?", schema=PERSON)
        assert result.error is not None
        assert result.error.kind == "invalid_output"
    assert server.stats.received == 4
    assert len(server.stats.by_key) == 4  # a provider honouring the key would have handed back the old answers
    assert server.stats.duplicate_successes == 0


async def test_a_stored_answer_the_models_code_now_refuses_is_asked_again(server: FakeServer, tmp_path: Path) -> None:
    from pydantic import field_validator

    class Loose(BaseModel):
        name: str

    class Picky(BaseModel):  # the same JSON Schema (so the same key), a validator of its own
        name: str

        @field_validator("name")
        @classmethod
        def not_text(cls, value: str) -> str:
            if value == "text":
                raise ValueError("a placeholder name")
            return value

    Picky.__name__ = "Loose"
    state = tmp_path / "state.db"
    async with _stored(server, state, max_reasks=0) as engine:
        first = await engine.complete("openai/m", "who?", schema=Loose)
    async with _stored(server, state, max_reasks=0) as engine:
        again = await engine.complete("openai/m", "who?", schema=Picky)
    assert first.ok
    assert not again.cached  # not served as ok with parsed None
    assert again.error is not None
    assert server.stats.received == 2


async def test_an_identical_request_in_flight_shares_the_answer_not_its_cost(
    server: FakeServer, tmp_path: Path
) -> None:
    server.structured.configure(first=1, kinds=["missing"])
    server.latency = 0.05
    async with _stored(server, tmp_path / "state.db") as engine:  # a store keys requests
        twins = [Request.from_prompt("openai/m", "same", schema=PERSON) for _ in range(2)]
        results = [r async for r in engine.map(twins)]
    leader, follower = sorted(results, key=lambda r: r.cached)
    assert leader.reask_cost_usd
    assert leader.reasks == 1
    assert follower.cached
    assert follower.cost_usd == 0.0
    assert follower.reask_cost_usd == 0.0
    assert server.stats.received == 2


async def test_anthropic_refuses_a_schema_whose_top_is_not_an_object(server: FakeServer) -> None:
    async with _engine(server, "anthropic") as engine:
        result = await engine.complete(
            "anthropic/m", "list them", schema={"type": "array", "items": {"type": "string"}}
        )
    assert result.error is not None
    assert result.error.kind == "invalid_request"
    assert "top level" in result.error.message
    assert server.stats.received == 0


def test_a_pydantic_model_with_no_json_schema_is_refused() -> None:
    from collections.abc import Callable

    class WithCallable(BaseModel):
        hook: Callable[[int], int]

    with pytest.raises(InvalidRequestError, match="has no JSON Schema"):
        Schema(WithCallable)
