"""``sluice run`` on lines written for other APIs: OpenAI Batch API lines with
``"url": "/v1/responses"`` or ``"/v1/messages"``, Anthropic Message Batches requests
(``custom_id`` and ``params``) and bare bodies of either shape, run like chat lines
against the fake: each deployment is sent its own API's body, or the translation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from clitools import read_output, run_cli, write_jsonl

from sluice.testing import FakeServer


def config(server: FakeServer, tmp_path: Path) -> Path:
    """``openai/gpt-test`` (speaks Responses), ``chat-test`` (Chat Completions only) and
    ``anthropic/claude-test``, all at the fake."""
    path = tmp_path / "sluice.toml"
    path.write_text(
        f'[[deployment]]\nmodel = "openai/gpt-test"\nbase_url = "{server.url}"\napi_key_env = "OPENAI_API_KEY"\n'
        f'[[deployment]]\nmodel = "chat-test"\nbase_url = "{server.url}"\napi_key_env = "OPENAI_API_KEY"\n'
        f'[[deployment]]\nmodel = "anthropic/claude-test"\nbase_url = "{server.anthropic_url}"\n'
        'api_key_env = "OPENAI_API_KEY"\n'
    )
    return path


def responses_line(i: int, model: str) -> dict[str, Any]:
    body = {"model": model, "input": f"responses {i}", "max_output_tokens": 40}
    return {"custom_id": f"r-{model}-{i}", "method": "POST", "url": "/v1/responses", "body": body}


def messages_line(i: int, model: str) -> dict[str, Any]:
    body = {"model": model, "max_tokens": 40, "system": "be brief", "messages": [{"role": "user", "content": f"m {i}"}]}
    return {"custom_id": f"m-{model}-{i}", "method": "POST", "url": "/v1/messages", "body": body}


def test_responses_and_messages_lines_run_on_every_kind_of_deployment(server: FakeServer, tmp_path: Path) -> None:
    lines: list[Any] = []
    for model in ("openai/gpt-test", "chat-test", "anthropic/claude-test"):
        lines += [responses_line(i, model) for i in range(3)] + [messages_line(i, model) for i in range(3)]
    lines.append({"custom_id": "batches-1", "params": messages_line(9, "anthropic/claude-test")["body"]})
    lines.append({"model": "chat-test", "input": [{"role": "user", "content": "bare responses"}]})
    lines.append(
        {
            "model": "openai/gpt-test",
            "system": "s",
            "max_tokens": 30,
            "messages": [{"role": "user", "content": "bare m"}],
        }
    )
    source = write_jsonl(tmp_path / "in.jsonl", lines)
    out = tmp_path / "out.jsonl"
    done = run_cli(server, "run", source, "-o", out, "--config", config(server, tmp_path))
    assert done.returncode == 0, done.stderr
    records = {r["id"]: r for r in read_output(out)}
    assert len(records) == len(lines)
    assert all(r["ok"] for r in records.values()), [r["error"] for r in records.values() if not r["ok"]]
    assert records["r-chat-test-1"]["text"] == "echo: responses 1"
    assert records["m-anthropic/claude-test-2"]["text"] == "echo: m 2"
    assert records["batches-1"]["text"] == "echo: m 9"
    paths = server.stats.by_path
    # Responses lines to the Responses deployment went as Responses; every other line was translated
    assert paths["/v1/responses"] == 3
    assert paths["/v1/messages"] == 3 + 3 + 1
    assert paths["/v1/chat/completions"] == 3 + 3 + 3 + 1 + 1


def test_a_line_a_chat_deployment_cannot_be_told_fails_alone(server: FakeServer, tmp_path: Path) -> None:
    search = {"model": "chat-test", "input": "look it up", "tools": [{"type": "web_search"}]}
    lines = [
        {"custom_id": "lost", "method": "POST", "url": "/v1/responses", "body": search},
        responses_line(1, "chat-test"),
        {"custom_id": "bad", "method": "POST", "url": "/v1/messages", "body": {"model": "chat-test", "messages": []}},
    ]
    source = write_jsonl(tmp_path / "in.jsonl", lines)
    out = tmp_path / "out.jsonl"
    done = run_cli(server, "run", source, "-o", out, "--config", config(server, tmp_path))
    assert done.returncode != 0  # some lines failed: the exit code says so
    records = {r["id"]: r for r in read_output(out)}
    assert records["r-chat-test-1"]["ok"]
    assert "web_search" in records["lost"]["error"]["message"]
    assert "max_tokens" in records["bad"]["error"]["message"] or "messages" in records["bad"]["error"]["message"]
    assert server.stats.by_path.get("/v1/chat/completions") == 1


def test_the_jobs_flags_apply_to_a_native_body(server: FakeServer, tmp_path: Path) -> None:
    """--max-tokens reaches a Responses body as max_output_tokens: the fake, whose answers
    are 40 tokens long here, cuts them at 20 and says the response is incomplete."""
    server.output_tokens = 40
    body = {"model": "openai/gpt-test", "input": "a question"}
    lines = [{"custom_id": "long", "method": "POST", "url": "/v1/responses", "body": body}]
    source = write_jsonl(tmp_path / "in.jsonl", lines)
    out = tmp_path / "out.jsonl"
    done = run_cli(server, "run", source, "-o", out, "--config", config(server, tmp_path), "--max-tokens", "20")
    assert done.returncode == 0, done.stderr
    (record,) = read_output(out)
    assert record["finish_reason"] == "length"
    assert record["usage"]["output_tokens"] == 20
    assert record["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


def test_a_bare_model_name_runs_on_the_configured_deployment_of_that_model(server: FakeServer, tmp_path: Path) -> None:
    """Issue 34 point 23: lines naming ``claude-test`` (as Anthropic's SDK and batch files
    do) go to the one configured ``anthropic/claude-test``, with its key, price and
    limits, not to an OpenAI endpoint nobody configured (which wanted $OPENAI_API_KEY)."""
    import os

    path = tmp_path / "sluice.toml"
    path.write_text(
        f'[[deployment]]\nmodel = "anthropic/claude-test"\nbase_url = "{server.anthropic_url}"\n'
        'api_key_env = "MY_CLAUDE_KEY"\nrpm = 600\nprice = { input_per_mtok = 1.0, output_per_mtok = 5.0 }\n'
    )
    lines = [
        {"model": "claude-test", "max_tokens": 20, "messages": [{"role": "user", "content": f"q {i}"}]}
        for i in range(4)
    ]
    source = write_jsonl(tmp_path / "in.jsonl", lines)
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    env.update(MY_CLAUDE_KEY="sk-test", OPENAI_BASE_URL=server.url, NO_COLOR="1")
    out = tmp_path / "out.jsonl"
    done = run_cli(server, "run", source, "-o", out, "--config", path, "--budget", "1", env=env)
    assert done.returncode == 0, done.stderr
    records = read_output(out)
    assert [r["deployment"] for r in records] == ["anthropic/claude-test"] * 4
    assert all(r["cost_usd"] and r["cost_usd"] > 0 for r in records)  # the configured price, not "unpriced"
    assert server.stats.by_path == {"/v1/messages": 4}
    estimate = run_cli(server, "estimate", source, "--config", path, env=env)
    assert estimate.returncode == 0, estimate.stderr
    assert "anthropic/claude-test" in estimate.stdout
    assert "openai" not in estimate.stdout


def test_a_bare_model_name_two_configured_models_share_is_refused_naming_both(
    server: FakeServer, tmp_path: Path
) -> None:
    path = tmp_path / "sluice.toml"
    path.write_text(
        f'[[deployment]]\nmodel = "openai/claude-test"\nbase_url = "{server.url}"\napi_key_env = "OPENAI_API_KEY"\n'
        f'[[deployment]]\nmodel = "anthropic/claude-test"\nbase_url = "{server.anthropic_url}"\n'
        'api_key_env = "OPENAI_API_KEY"\n'
    )
    lines = [{"model": "claude-test", "max_tokens": 20, "messages": [{"role": "user", "content": "q"}]}]
    source = write_jsonl(tmp_path / "in.jsonl", lines)
    done = run_cli(server, "run", source, "-o", tmp_path / "out.jsonl", "--config", path)
    assert done.returncode == 2, done.stderr
    assert "'openai/claude-test', 'anthropic/claude-test'" in done.stderr
    assert "name one of them in full" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "sluice.toml"]
    assert server.stats.received == 0
