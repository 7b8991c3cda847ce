"""Input files: byte order marks, and --model filling in rather than overriding."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from sluice.batch._inputs import InputOptions, Template, count_records, read_inputs

BOM = b"\xef\xbb\xbf"


def chat(model: str | None = None, text: str = "hi") -> dict[str, Any]:
    body: dict[str, Any] = {"messages": [{"role": "user", "content": text}]}
    if model is not None:
        body["model"] = model
    return body


def write_jsonl(path: Path, records: list[Any], prefix: bytes = b"") -> Path:
    path.write_bytes(prefix + "".join(json.dumps(r) + "\n" for r in records).encode())
    return path


def test_a_bom_before_the_first_jsonl_line_is_skipped(tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", [chat(text="one"), chat(text="two")], prefix=BOM)
    options = InputOptions(model="simulate/demo")
    items = list(read_inputs(source, options))
    assert [item.error for item in items] == [None, None]
    assert [item.request.messages[0]["content"] for item in items if item.request] == ["one", "two"]
    assert count_records(source, options) == 2


def test_a_bom_alone_on_the_first_line_is_a_blank_line(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_bytes(BOM + b"\n" + json.dumps(chat()).encode() + b"\n")
    options = InputOptions(model="simulate/demo")
    assert [(item.line, item.error) for item in read_inputs(source, options)] == [(2, None)]
    assert count_records(source, options) == 1


def test_a_bom_before_the_csv_header_is_skipped(tmp_path: Path) -> None:
    source = tmp_path / "in.csv"
    source.write_bytes(BOM + b"name,age\r\nada,36\r\nalan,41\r\n")  # as Excel saves "CSV UTF-8"
    options = InputOptions(model="simulate/demo", template=Template("Who is {name}?"))
    items = list(read_inputs(source, options))
    assert [item.error for item in items] == [None, None]
    assert items[0].request is not None
    assert items[0].request.messages[0]["content"] == "Who is ada?"
    assert items[0].request.metadata == {"name": "ada", "age": "36"}
    assert count_records(source, options) == 2


def test_record_counts_handle_blank_lines_crlf_and_quoted_newlines(tmp_path: Path) -> None:
    from sluice.batch._inputs import InputOptions, Template, count_records

    jsonl = tmp_path / "a.jsonl"
    jsonl.write_bytes(b'{"messages": []}\r\n\r\n  \n{"messages": []}\n\n\n')
    assert count_records(jsonl, InputOptions()) == 2
    table = tmp_path / "a.csv"
    table.write_text('name,notes\nx,"two\nlines"\ny,plain\n\n')
    assert count_records(table, InputOptions(template=Template("{name}"))) == 2


def test_model_fills_in_and_never_replaces_a_records_own(tmp_path: Path) -> None:
    source = write_jsonl(
        tmp_path / "in.jsonl",
        [chat(), chat("openai/other"), chat("gpt-4o-mini"), chat("openai/gpt-4o-mini"), {"model": "", **chat()}],
    )
    items = list(read_inputs(source, InputOptions(model="openai/gpt-4o-mini", default_model="simulate/demo")))
    assert [item.request.model for item in items if item.request] == [
        "openai/gpt-4o-mini",
        "openai/other",
        "gpt-4o-mini",  # a bare name is the OpenAI model --model names: the same model
        "openai/gpt-4o-mini",
        "openai/gpt-4o-mini",
    ]
    assert [item.own_model for item in items] == [None, "openai/other", None, None, None]


def test_force_model_sends_every_record_to_model(tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", [chat(), chat("openai/other"), {"model": 7, **chat()}])
    items = list(read_inputs(source, InputOptions(model="simulate/demo", force_model=True)))
    assert [item.request.model for item in items if item.request] == ["simulate/demo"] * 3
    assert [item.own_model for item in items] == [None, None, None]


def test_without_model_the_config_default_fills_in(tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", [chat(), chat("openai/other"), {"model": 7, **chat()}])
    items = list(read_inputs(source, InputOptions(default_model="simulate/demo")))
    assert [item.request.model for item in items if item.request] == ["simulate/demo", "openai/other"]
    assert [item.own_model for item in items] == [None, None, None]
    assert items[2].error is not None
    assert items[2].error.message == "line 3: model must be a string, got 7"


def test_batch_api_lines_keep_their_model_too(tmp_path: Path) -> None:
    line = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": chat("openai/other")}
    source = write_jsonl(tmp_path / "in.jsonl", [line])
    (item,) = read_inputs(source, InputOptions(model="simulate/demo"))
    assert item.request is not None
    assert (item.request.model, item.own_model, item.custom_id) == ("openai/other", "openai/other", "a")


def test_template_rows_have_no_own_model(tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", [{"name": "x", "model": "openai/other"}])
    (item,) = read_inputs(source, InputOptions(model="simulate/demo", template=Template("{name}")))
    assert item.request is not None
    assert (item.request.model, item.own_model) == ("simulate/demo", None)


def estimate(tmp_path: Path, *args: str | Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_COLOR": "1", "SLUICE_TRUST_FILE": str(tmp_path / "trust.json")}
    return subprocess.run(
        [sys.executable, "-m", "sluice", "estimate", *map(str, args)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_estimate_counts_each_model_the_file_keeps(tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", [chat(), chat(), chat("simulate/other")])
    kept = estimate(tmp_path, source, "--model", "simulate/demo")
    assert kept.returncode == 0, kept.stderr
    assert re.search(r"simulate/demo +2 requests", kept.stdout)
    assert re.search(r"simulate/other +1 requests", kept.stdout)
    forced = estimate(tmp_path, source, "--model", "simulate/demo", "--force-model")
    assert forced.returncode == 0, forced.stderr
    assert "3 requests" in forced.stdout
    assert "simulate/other" not in forced.stdout
    alone = estimate(tmp_path, source, "--force-model")
    assert alone.returncode == 2
    assert "--force-model needs --model" in alone.stderr
