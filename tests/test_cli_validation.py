"""Flags, config and inputs that cannot work are refused before anything is created or
sent: exit 2, a message naming what to change, and no file left behind."""

from __future__ import annotations

from pathlib import Path

import pytest
from clitools import MODEL, questions, run_cli, write_jsonl

from sluice.testing import FakeServer


def assert_refused(done: object, tmp_path: Path, *expected: str, keep: tuple[str, ...] = ("in.jsonl",)) -> None:
    """Exit 2, each ``expected`` text in the message, no traceback, and no new file."""
    import subprocess

    assert isinstance(done, subprocess.CompletedProcess)
    assert done.returncode == 2, (done.returncode, done.stderr)
    for text in expected:
        assert text in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(keep)


@pytest.mark.parametrize(
    ("command", "url", "problem"),
    [
        ("run", "http://127.0.0.1:1/0", "the scheme 'http://'"),
        ("run", "127.0.0.1:6379", "not a Redis URL"),
        ("run", "redis://127.0.0.1:99999/0", "the port is not a number"),
        ("run", "redis://127.0.0.1:6379/zero", "the database 'zero' is not a number"),
        ("worker", "http://127.0.0.1:1/0", "the scheme 'http://'"),
        ("serve", "https://127.0.0.1:1/0", "the scheme 'https://'"),
    ],
)
def test_a_redis_url_redis_cannot_use_is_a_flag_error(
    server: FakeServer, tmp_path: Path, command: str, url: str, problem: str
) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", questions(3))
    args: list[str | Path] = {
        "run": ["run", source, "-o", tmp_path / "out.jsonl", "--model", MODEL],
        "worker": ["worker"],
        "serve": ["serve"],
    }[command]
    done = run_cli(server, *args, "--redis", url)
    assert_refused(done, tmp_path, "'--redis'", problem, "redis://", "rediss://", "unix://")


def test_a_redis_url_in_an_error_never_shows_its_password(server: FakeServer, tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", questions(3))
    done = run_cli(server, "run", source, "-o", tmp_path / "out.jsonl", "--redis", "https://:hunter2secret@h:1/0")
    assert_refused(done, tmp_path, "'--redis'")
    assert "hunter2secret" not in done.stderr


def test_a_template_field_the_csv_header_lacks_is_refused_at_once(server: FakeServer, tmp_path: Path) -> None:
    source = tmp_path / "in.csv"
    source.write_text("name,version\nrequests,2.32\nhttpx,0.28\n")
    done = run_cli(
        server, "run", source, "-o", tmp_path / "out.jsonl", "--model", MODEL,
        "--template", "What is {package} {version}?",
    )  # fmt: skip
    assert_refused(done, tmp_path, "{package} in --template", "'name', 'version'", keep=("in.csv",))
    assert server.stats.received == 0


def test_no_model_anywhere_is_refused_before_anything_is_created(server: FakeServer, tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", questions(5))
    done = run_cli(server, "run", source, "-o", tmp_path / "out.jsonl")
    assert_refused(done, tmp_path, "no model", "--model")


def test_an_input_that_is_not_text_is_refused_as_a_whole(server: FakeServer, tmp_path: Path) -> None:
    import random

    noise = random.Random(7).randbytes(2 * 1024 * 1024)
    (tmp_path / "in.jsonl").write_bytes(noise.replace(b"\x00", b"\x01"))  # no NUL: the UTF-8 test decides
    done = run_cli(server, "run", tmp_path / "in.jsonl", "-o", tmp_path / "out.jsonl", "--model", MODEL)
    assert_refused(done, tmp_path, "is not text", "lines are not UTF-8")
    (tmp_path / "in.jsonl").write_bytes(b"\xff\xfe" + '{"messages": []}\n'.encode("utf-16-le"))
    done = run_cli(server, "run", tmp_path / "in.jsonl", "-o", tmp_path / "out.jsonl", "--model", MODEL)
    assert_refused(done, tmp_path, "UTF-16", "save it as UTF-8")


def test_a_directory_given_as_input_says_it_is_one(server: FakeServer, tmp_path: Path) -> None:
    (tmp_path / "prompts").mkdir()
    done = run_cli(server, "run", tmp_path / "prompts", "-o", tmp_path / "out.jsonl", "--model", MODEL)
    assert_refused(done, tmp_path, "is a directory", keep=("prompts",))
    assert "no such input file" not in done.stderr


def test_an_output_in_a_directory_that_does_not_exist_is_an_error_not_created(
    server: FakeServer, tmp_path: Path
) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", questions(2))
    for flag in ("-o", "--state"):
        other = ["--state", tmp_path / "s.db"] if flag == "-o" else ["-o", tmp_path / "out.jsonl"]
        done = run_cli(server, "run", source, flag, tmp_path / "missing" / "x", *other, "--model", MODEL)
        assert_refused(done, tmp_path, f"{flag} ", "does not exist; create it first")


def test_a_missing_key_is_refused_before_anything_is_sent_even_for_a_local_server(
    server: FakeServer, tmp_path: Path
) -> None:
    import os

    source = write_jsonl(tmp_path / "in.jsonl", questions(30))
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    env.update(OPENAI_BASE_URL=server.url, NO_COLOR="1")
    done = run_cli(server, "run", source, "-o", tmp_path / "out.jsonl", "--model", MODEL, env=env)
    assert_refused(done, tmp_path, "no API key; set $OPENAI_API_KEY", "OPENAI_API_KEY=EMPTY")
    assert server.stats.received == 0


def test_a_server_that_needs_no_key_runs_with_any_key_as_the_error_says(tmp_path: Path) -> None:
    import os

    from clitools import read_output

    with FakeServer().running_in_thread() as keyless:  # vLLM, Ollama: no key checked
        source = write_jsonl(tmp_path / "in.jsonl", questions(5))
        env = {**os.environ, "OPENAI_BASE_URL": keyless.url, "OPENAI_API_KEY": "EMPTY", "NO_COLOR": "1"}
        done = run_cli(keyless, "run", source, "-o", tmp_path / "out.jsonl", "--model", MODEL, env=env)
    assert done.returncode == 0, done.stderr
    assert len(read_output(tmp_path / "out.jsonl")) == 5


@pytest.mark.parametrize(
    ("written", "hint"),
    [
        ('"$OPENAI_API_KEY"', "without the $: api_key_env = 'OPENAI_API_KEY'"),
        ('"${OPENAI_API_KEY}"', "without the $: api_key_env = 'OPENAI_API_KEY'"),
        ('"sk-proj-abc123def456"', "NAME of the environment variable"),
    ],
)
def test_api_key_env_written_as_a_shell_expansion_or_a_key_gets_a_hint(
    server: FakeServer, tmp_path: Path, written: str, hint: str
) -> None:
    config = tmp_path / "sluice.toml"
    config.write_text(f'[[deployment]]\nmodel = "{MODEL}"\napi_key_env = {written}\n')
    done = run_cli(server, "config", "check", "--config", config)
    assert done.returncode == 2, done.stderr
    assert hint in done.stderr
    assert "sk-proj-abc123def456" not in done.stderr  # what may be a key is never echoed


def test_a_temperature_no_provider_takes_is_refused(server: FakeServer, tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", questions(2))
    done = run_cli(server, "run", source, "-o", tmp_path / "out.jsonl", "--model", MODEL, "--temperature", "9")
    assert_refused(done, tmp_path, "'--temperature'", "0<=x<=2")


def test_an_output_not_this_jobs_is_refused_leaving_no_state_behind(server: FakeServer, tmp_path: Path) -> None:
    """Issue 34 point 24: the refusal came after the state file was made, and left it."""
    source = write_jsonl(tmp_path / "in.jsonl", questions(3))
    (tmp_path / "other.jsonl").write_text("someone's notes\n")
    done = run_cli(server, "run", source, "-o", tmp_path / "other.jsonl", "--model", MODEL)
    assert_refused(done, tmp_path, "already exists and was not written by this job", keep=("in.jsonl", "other.jsonl"))
    assert (tmp_path / "other.jsonl").read_text() == "someone's notes\n"


def test_an_unpriced_model_under_a_budget_is_refused_before_any_file(server: FakeServer, tmp_path: Path) -> None:
    """Point 24: it showed progress, then refused, leaving an empty output and a state."""
    source = write_jsonl(tmp_path / "in.jsonl", questions(3))
    done = run_cli(
        server, "run", source, "-o", tmp_path / "out.jsonl", "--model", "openai/my-unknown-model", "--budget", "1"
    )
    assert_refused(done, tmp_path, "'openai/my-unknown-model' has no known price", "--allow-unpriced")
    assert "[sluice]" not in done.stderr  # no progress line for a job that never starts
    assert server.stats.received == 0


def test_a_report_refused_or_made_leaves_nothing_beside_the_state(server: FakeServer, tmp_path: Path) -> None:
    """Point 24: ``sluice report OUT --html <the job's input>`` is refused, and neither it
    nor a report that is made leaves SQLite's ``-wal``/``-shm`` files beside the state."""
    source = write_jsonl(tmp_path / "in.jsonl", questions(3))
    out = tmp_path / "out.jsonl"
    assert run_cli(server, "run", source, "-o", out, "--model", MODEL).returncode == 0
    before = sorted(p.name for p in tmp_path.iterdir())
    assert before == ["in.jsonl", "out.jsonl", "out.sluice.db"]
    refused = run_cli(server, "report", out, "--html", source)
    assert_refused(refused, tmp_path, "is the job's input", keep=tuple(before))
    made = run_cli(server, "report", out)
    assert made.returncode == 0, made.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before
