"""Structured outputs through the ``sluice`` command and ``sluice serve``, against the fake
provider giving invalid answers: a 500-line job whose answers are invalid a fifth of the
time ends with every line valid (by the test's own validator) and the money the server
billed equal to the records' sum; one whose answers are always invalid ends with every
line ``invalid_output``, exit 1, within its budget; a plain rerun asks again; ``--schema``
takes a file or a Pydantic model; ``sluice export`` flattens the answers; serve validates
for clients that ask it to."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
from clitools import MODEL, env_for, questions, read_output, run_cli, write_jsonl
from pydantic import BaseModel
from servetools import ALICE_KEY, UPSTREAM_KEY, deployment, fake, sdk, serving

from sluice.serve.core._settings import ClientSpec
from sluice.testing import FakeServer

PRICE = (1.0, 2.0)
SCHEMA = {
    "type": "object",
    "properties": {
        "sentiment": {"type": "string", "enum": ["positive", "negative", "neutral"]},
        "score": {"type": "number", "minimum": 0, "maximum": 1},
        "topics": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "author": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
            "required": ["name", "age"],
            "additionalProperties": False,
        },
    },
    "required": ["sentiment", "score", "topics", "author"],
    "additionalProperties": False,
}


@pytest.fixture
def server() -> Iterator[FakeServer]:
    fake_server = FakeServer(api_key="sk-test", prices={"*": PRICE}, seed=11)
    with fake_server.running_in_thread():
        yield fake_server


def _a_review(value: Any) -> bool:
    """SCHEMA checked by hand, sharing nothing with jsonschema."""
    author = value.get("author") if isinstance(value, dict) else None
    return (
        isinstance(value, dict)
        and set(value) == {"sentiment", "score", "topics", "author"}
        and value["sentiment"] in ("positive", "negative", "neutral")
        and type(value["score"]) in (int, float)
        and 0 <= value["score"] <= 1
        and isinstance(value["topics"], list)
        and len(value["topics"]) >= 1
        and all(isinstance(t, str) for t in value["topics"])
        and isinstance(author, dict)
        and set(author) == {"name", "age"}
        and isinstance(author["name"], str)
        and type(author["age"]) is int
    )


def _job(tmp_path: Path, n: int) -> tuple[Path, Path, Path]:
    schema = tmp_path / "review.json"
    schema.write_text(json.dumps(SCHEMA))
    return write_jsonl(tmp_path / "in.jsonl", questions(n, max_tokens=60)), tmp_path / "out.jsonl", schema


def _run(server: FakeServer, *args: Any, **env: str) -> Any:
    return run_cli(server, "run", *args, "--model", MODEL, "--price", "1,2", timeout=120, env=env_for(server, **env))


def test_a_job_with_invalid_answers_ends_with_every_line_valid_and_billed_once(
    server: FakeServer, tmp_path: Path
) -> None:
    server.structured.configure(rate=0.2)  # prose, cut, fenced, missing, wrong_type
    src, out, schema = _job(tmp_path, 500)
    # each ask is invalid with p = 0.16 (a fence is taken as it is): with the default 5 re-asks
    # a line of the 500 is still invalid in ~1 job of 120; with 7, in 1 of 5,000 (not flaky)
    done = _run(server, src, "-o", out, "--schema", schema, "--max-reasks", "7")
    assert done.returncode == 0, done.stdout + done.stderr
    records = read_output(out)
    assert sorted(r["line"] for r in records) == list(range(1, 501))
    for record in records:
        assert record["ok"], record["error"]
        jsonschema.validate(record["parsed"], SCHEMA)
        assert _a_review(record["parsed"])  # and by hand: sluice validates with jsonschema too
        assert record["parsed"] == json.loads(record["text"].strip().removeprefix("```json").removesuffix("```"))
    reasked = [r for r in records if r["reasks"]]
    spoiled = sum(n for kind, n in server.structured.given.items() if kind != "fenced")
    assert len(reasked) > 50  # ~20% of 500, and a re-ask may itself be spoiled
    assert sum(r["reasks"] for r in records) == spoiled  # every invalid answer (and only those) re-asked
    assert server.stats.received == 500 + spoiled
    assert sum(r["cost_usd"] for r in records) == pytest.approx(server.total_billed_usd, rel=1e-9)
    assert sum(r["reask_cost_usd"] for r in records) > 0
    assert server.stats.duplicate_successes == 0
    assert "structured (this run)  500 valid" in done.stdout
    report = run_cli(server, "report", out)
    assert "500 valid" in report.stdout, report.stdout


def test_always_invalid_answers_end_as_invalid_output_within_the_budget(server: FakeServer, tmp_path: Path) -> None:
    server.structured.configure(rate=1.0, kinds=["prose", "missing", "wrong_type"])
    src, out, schema = _job(tmp_path, 500)
    budget = 1.0  # room for every ask's worst case while it runs (~$0.27 is billed)
    done = _run(server, src, "-o", out, "--schema", schema, "--budget", str(budget), "--max-reasks", "2")
    assert done.returncode == 1, done.stdout + done.stderr
    records = read_output(out)
    assert len(records) == 500
    assert {r["error"]["type"] for r in records} == {"invalid_output"}
    assert all(r["reasks"] == 2 and r["attempts"] == 3 and r["error"]["errors"] for r in records)
    assert server.stats.received == 1500
    assert server.total_billed_usd <= budget
    assert sum(r["cost_usd"] for r in records) == pytest.approx(server.total_billed_usd, rel=1e-9)
    assert "500 invalid_output; 1,000 re-asks cost" in done.stdout
    # a plain rerun asks again (invalid_output is not kept), and the answers are valid now
    server.structured.configure()
    again = _run(server, src, "-o", out, "--schema", schema)
    assert again.returncode == 0, again.stdout + again.stderr
    assert all(r["ok"] and r["reasks"] == 0 for r in read_output(out))


def test_a_tight_budget_stops_the_reasks_and_the_job_says_so(server: FakeServer, tmp_path: Path) -> None:
    server.structured.configure(rate=1.0, kinds=["wrong_type"])
    src, out, schema = _job(tmp_path, 40)
    budget = 0.004  # about two asks a line at their worst case: not three
    done = _run(server, src, "-o", out, "--schema", schema, "--budget", str(budget), "--max-reasks", "5")
    assert done.returncode in (1, 4), done.stdout + done.stderr
    assert server.total_billed_usd <= budget
    records = read_output(out)
    assert len(records) == 40
    assert sum(r["cost_usd"] or 0 for r in records) == pytest.approx(server.total_billed_usd, rel=1e-9)
    assert all(r["reasks"] < 5 for r in records if "reasks" in r)


def test_a_pydantic_model_by_module_and_name(server: FakeServer, tmp_path: Path) -> None:
    (tmp_path / "shapes.py").write_text(
        textwrap.dedent(
            """
            from pydantic import BaseModel

            class Review(BaseModel):
                sentiment: str
                score: float
            """
        )
    )
    src = write_jsonl(tmp_path / "in.jsonl", questions(5))
    out = tmp_path / "out.jsonl"
    env = env_for(server)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "sluice",
            "run",
            str(src),
            "-o",
            str(out),
            "--model",
            MODEL,
            "--schema",
            "shapes:Review",
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert all(set(r["parsed"]) == {"sentiment", "score"} for r in read_output(out))


def test_a_batch_tier_job_reasks_in_later_batches(server: FakeServer, tmp_path: Path) -> None:
    server.structured.configure(first=1, kinds=["wrong_type"])
    src, out, schema = _job(tmp_path, 30)
    done = _run(server, src, "-o", out, "--schema", schema, "--tier", "batch", "--poll-every", "0.2")
    assert done.returncode == 0, done.stdout + done.stderr
    records = read_output(out)
    assert all(r["ok"] and r["reasks"] == 1 and r["tier"] == "batch" for r in records)
    for record in records:
        jsonschema.validate(record["parsed"], SCHEMA)
    assert server.stats.received == 0  # nothing synchronous
    assert sum(len(b.lines) for b in server.batches.batches.values()) == 60  # each line's two asks
    assert len(server.batches.batches) >= 2
    assert sum(r["cost_usd"] for r in records) == pytest.approx(server.total_billed_usd, rel=1e-9)


@pytest.mark.parametrize(
    ("content", "spec", "said"),
    [
        (None, "missing.json", "no such file"),
        ("{not json", "bad.json", "not JSON (line 1, column 2"),
        (
            '{"type": "object", "properties": {"a": {"type": 7}}}',
            "wrong.json",
            "not a valid JSON Schema at properties/a",
        ),
        ("[1, 2]", "list.json", "a JSON Schema is an object"),
        (None, "no_such_module:Model", "cannot import 'no_such_module'"),
        (None, "json:loads", "is not a class"),
    ],
)
def test_a_bad_schema_flag_is_refused_before_anything_runs(
    server: FakeServer, tmp_path: Path, content: str | None, spec: str, said: str
) -> None:
    if content is not None:
        (tmp_path / spec).write_text(content)
    src = write_jsonl(tmp_path / "in.jsonl", questions(2))
    out = tmp_path / "out.jsonl"
    schema = str(tmp_path / spec) if spec.endswith(".json") else spec
    done = run_cli(server, "run", src, "-o", out, "--model", MODEL, "--schema", schema)
    assert done.returncode == 2
    assert said in done.stderr, done.stderr
    assert not out.exists()
    assert server.stats.received == 0


def test_a_lines_own_response_format_is_its_schema_and_a_bad_one_fails_that_line_only(
    server: FakeServer, tmp_path: Path
) -> None:
    good = {"type": "json_schema", "json_schema": {"name": "review", "schema": SCHEMA, "strict": True}}
    lines = [
        {"messages": [{"role": "user", "content": "a"}], "response_format": good},
        {"messages": [{"role": "user", "content": "b"}], "response_format": {"type": "json_schema"}},
        {"messages": [{"role": "user", "content": "c"}]},  # no schema: a plain answer
    ]
    src, out = write_jsonl(tmp_path / "in.jsonl", lines), tmp_path / "out.jsonl"
    done = run_cli(server, "run", src, "-o", out, "--model", MODEL)
    assert done.returncode == 1, done.stderr
    by_line = {r["line"]: r for r in read_output(out)}
    jsonschema.validate(by_line[1]["parsed"], SCHEMA)
    assert by_line[2]["error"]["type"] == "invalid_input"
    assert "json_schema.schema" in by_line[2]["error"]["message"]
    assert by_line[3]["ok"]
    assert "parsed" not in by_line[3]


def test_export_flattens_parsed_into_columns(server: FakeServer, tmp_path: Path) -> None:
    src, out, schema = _job(tmp_path, 30)
    server.structured.configure(first=1, kinds=["missing"])
    assert _run(server, src, "-o", out, "--schema", schema).returncode == 0
    table = tmp_path / "table.csv"
    done = run_cli(server, "export", out, "--csv", table)
    assert done.returncode == 0, done.stderr
    with table.open(encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["line"]) for r in rows] == list(range(1, 31))
    assert {"parsed.sentiment", "parsed.score", "parsed.topics", "parsed.author.name", "parsed.author.age"} <= set(
        rows[0]
    )
    assert all(r["reasks"] == "1" and r["ok"] == "true" for r in rows)
    by_line = {r["line"]: r for r in read_output(out)}
    assert json.loads(rows[0]["parsed.topics"]) == by_line[1]["parsed"]["topics"]  # a list: its JSON
    assert rows[4]["parsed.author.name"] == by_line[5]["parsed"]["author"]["name"]
    refused = run_cli(server, "export", tmp_path / "in.jsonl", "--csv", tmp_path / "x.csv")
    assert refused.returncode == 2
    assert "not a sluice output record" in refused.stderr
    assert not (tmp_path / "x.csv").exists()


# -- serve -----------------------------------------------------------------------------------------


class Review(BaseModel):
    sentiment: str
    score: float


async def test_serve_validates_a_clients_schema_when_asked_to(tmp_path: Path) -> None:
    upstream = fake()
    upstream.structured.configure(first=1, kinds=["fenced", "missing"])
    alice = ClientSpec("alice", "ALICE_KEY", budget_usd=1.0)
    async with (
        upstream,
        serving([deployment(upstream)], tmp_path, clients=(alice,), validate_json=True) as url,
        sdk(url, ALICE_KEY) as client,
    ):
        parsed = await client.chat.completions.parse(
            model="openai/gpt-test", messages=[{"role": "user", "content": "review it"}], response_format=Review
        )
        assert isinstance(parsed.choices[0].message.parsed, Review)  # the SDK's own parse of what serve sent
        assert upstream.stats.received in (1, 2)  # a fenced first answer is cleaned, not re-asked
        upstream.structured.configure(rate=1.0, kinds=["prose"])
        with pytest.raises(openai.APIStatusError) as caught:
            await client.chat.completions.create(
                model="openai/gpt-test",
                messages=[{"role": "user", "content": "another"}],
                response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}},
            )
        assert caught.value.status_code == 502
        assert "invalid_output" in str(caught.value.body)
        assert UPSTREAM_KEY not in str(caught.value.body)


async def test_serve_passes_response_format_through_unless_asked_to_validate(tmp_path: Path) -> None:
    upstream = fake()
    upstream.structured.configure(rate=1.0, kinds=["prose"])
    async with upstream, serving([deployment(upstream)], tmp_path) as url, sdk(url) as client:
        answer = await client.chat.completions.create(
            model="openai/gpt-test",
            messages=[{"role": "user", "content": "x"}],
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}},
        )
    assert answer.choices[0].message.content
    assert answer.choices[0].message.content.startswith("Sure!")
    assert upstream.stats.received == 1


def test_export_will_not_overwrite_the_job_itself(server: FakeServer, tmp_path: Path) -> None:
    src, out, schema = _job(tmp_path, 3)
    assert _run(server, src, "-o", out, "--schema", schema).returncode == 0
    before = out.read_bytes()
    for target in (out, out.with_suffix(".sluice.db"), tmp_path):
        refused = run_cli(server, "export", out, "--csv", target)
        assert refused.returncode == 2, refused.stderr
        assert "Traceback" not in refused.stderr
    assert out.read_bytes() == before


def test_a_list_schema_for_an_anthropic_model_is_refused_up_front(server: FakeServer, tmp_path: Path) -> None:
    (tmp_path / "list.json").write_text(json.dumps({"type": "array", "items": {"type": "string"}}))
    src, out = write_jsonl(tmp_path / "in.jsonl", questions(2)), tmp_path / "out.jsonl"
    done = run_cli(server, "run", src, "-o", out, "--model", "anthropic/claude-x", "--schema", tmp_path / "list.json")
    assert done.returncode == 2
    assert "answers JSON as a tool's input, which is an object" in done.stderr
    assert not out.exists()


def test_a_line_with_tools_keeps_its_response_format_as_given(server: FakeServer, tmp_path: Path) -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    fmt = {"type": "json_schema", "json_schema": {"name": "review", "schema": SCHEMA}}
    src = write_jsonl(
        tmp_path / "in.jsonl",
        [{"messages": [{"role": "user", "content": "a"}], "tools": tools, "response_format": fmt}],
    )
    out = tmp_path / "out.jsonl"
    done = run_cli(server, "run", src, "-o", out, "--model", MODEL)
    assert done.returncode == 0, done.stderr
    (record,) = read_output(out)
    assert "parsed" not in record  # not checked: the answer could have been a tool call
    assert server.structured.last_body is not None
    assert server.structured.last_body["response_format"] == fmt


async def test_serve_passes_n_above_one_through_unchecked(tmp_path: Path) -> None:
    upstream = fake()
    async with upstream, serving([deployment(upstream)], tmp_path, validate_json=True) as url, sdk(url) as client:
        answer = await client.chat.completions.create(
            model="openai/gpt-test",
            messages=[{"role": "user", "content": "x"}],
            n=2,
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}},
        )
    assert answer.choices
    assert upstream.stats.received == 1
