"""The CLI end to end: a subprocess against the fake server over loopback."""

from __future__ import annotations

import csv
import json
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from clitools import MODEL, env_for, questions, read_output, run_cli, sluice_cmd, wait_until, write_jsonl

from sluice import Request, store_key
from sluice._job import idempotency_key_of
from sluice.testing import FakeServer


def test_a_simple_run_writes_one_record_per_line(server: FakeServer, tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", questions(30))
    done = run_cli(server, "run", source, "-o", tmp_path / "out.jsonl", "--model", MODEL)
    assert done.returncode == 0, done.stderr
    records = read_output(tmp_path / "out.jsonl")
    assert sorted(r["line"] for r in records) == list(range(1, 31))
    assert all(r["ok"] for r in records)
    by_line = {r["line"]: r for r in records}
    assert by_line[7]["text"] == "echo: question 6"
    assert by_line[7]["usage"]["output_tokens"] == 16
    assert "out.sluice.db" in done.stdout
    assert "sk-test" not in done.stdout + done.stderr
    assert server.stats.accepted == 30


def test_resume_after_sigkill_never_resends_a_stored_success(server: FakeServer, tmp_path: Path) -> None:
    server.latency = 0.02
    n = 400
    source = write_jsonl(tmp_path / "in.jsonl", questions(n))
    output = tmp_path / "out.jsonl"
    args = ["run", source, "-o", output, "--model", MODEL, "--concurrency", "8"]
    process = subprocess.Popen(
        sluice_cmd(*args), env=env_for(server), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_until(lambda: server.stats.accepted >= 100)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
    wait_until(lambda: server.in_flight == 0)  # the server finishes the requests the dead client left behind
    first_run = server.stats.accepted
    assert 100 <= first_run < n
    from sluice.store import SqliteStore

    store = SqliteStore(tmp_path / "out.sluice.db", readonly=True)
    stored = store.summary()["succeeded"]
    store.close()
    # every answer the client stored before it died, by its idempotency key
    keys_of_line = {
        i + 1: idempotency_key_of(store_key(Request(MODEL, q["messages"], max_tokens=20)))
        for i, q in enumerate(questions(n))
    }

    server.latency = 0.0
    done = run_cli(server, *args)
    assert done.returncode == 0, done.stderr
    records = read_output(output)
    assert sorted(r["line"] for r in records) == list(range(1, n + 1))  # exactly one each
    assert all(r["ok"] for r in records)
    resent = sum(1 for line, key in keys_of_line.items() if server.stats.by_key[key] > 1)
    # only requests in flight at the kill (sent, never stored) may have gone twice
    assert resent <= 8
    assert server.stats.duplicate_successes == resent
    assert server.stats.accepted == n + resent
    assert stored >= first_run - 8


def test_malformed_lines_are_reported_by_line_and_the_rest_succeed(server: FakeServer, tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    good = json.dumps(questions(1)[0])
    source.write_bytes(
        b"\n".join(
            [
                good.encode(),
                b'{"messages": [{"role": "user", "content": "broken"}',  # 2: truncated JSON
                b'{"messages": []}',  # 3: empty messages
                b'{"max_tokens": 5}',  # 4: no messages
                b"\xff\xfe not utf-8",  # 5
                b"[1, 2, 3]",  # 6: not an object
                b"",  # 7: blank, skipped
                b'{"messages": [{"role": "user", "content": "fine"}], "max_tokens": "many"}',  # 8
                good.replace("question 0", "question 9").encode(),  # 9
            ]
        )
        + b"\n"
    )
    done = run_cli(server, "run", source, "-o", tmp_path / "out.jsonl", "--model", MODEL, "--ordered")
    assert done.returncode == 1, done.stderr  # finished; the bad lines are failed records
    records = read_output(tmp_path / "out.jsonl")
    assert [r["line"] for r in records] == [1, 2, 3, 4, 5, 6, 8, 9]
    errors = {r["line"]: r["error"]["message"] for r in records if not r["ok"]}
    assert errors[2].startswith("line 2: not valid JSON")
    assert "messages is empty" in errors[3]
    assert "expected a chat request" in errors[4]
    assert errors[5] == "line 5: not valid UTF-8 (byte 0xff at column 1)"
    assert "expected a JSON object, got list" in errors[6]
    assert "max_tokens must be a positive integer" in errors[8]
    assert all(r["error"]["type"] == "invalid_input" for r in records if not r["ok"])
    assert [r["ok"] for r in records if r["line"] in (1, 9)] == [True, True]


def test_strict_stops_at_the_first_bad_line(server: FakeServer, tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    lines = [json.dumps(q) for q in questions(5)]
    lines[2] = "not json"
    source.write_text("\n".join(lines) + "\n")
    done = run_cli(server, "run", source, "-o", tmp_path / "out.jsonl", "--model", MODEL, "--strict")
    assert done.returncode == 3  # --strict stopped the job itself
    assert "line 3: not valid JSON" in done.stderr
    assert "--strict" in done.stderr
    assert sorted(r["line"] for r in read_output(tmp_path / "out.jsonl")) == [1, 2]


def test_ordered_output_keeps_input_order(server: FakeServer, tmp_path: Path) -> None:
    server.latency_jitter = 0.02
    source = write_jsonl(tmp_path / "in.jsonl", questions(40))
    done = run_cli(server, "run", source, "-o", tmp_path / "out.jsonl", "--model", MODEL, "--ordered")
    assert done.returncode == 0, done.stderr
    assert [r["line"] for r in read_output(tmp_path / "out.jsonl")] == list(range(1, 41))


def test_openai_batch_api_files_run_unchanged(server: FakeServer, tmp_path: Path) -> None:
    batch = [
        {
            "custom_id": f"task-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "gpt-test", "messages": [{"role": "user", "content": f"item {i}"}], "max_tokens": 10},
        }
        for i in range(5)
    ]
    batch.append({"custom_id": "task-bad", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x"}})
    source = write_jsonl(tmp_path / "batch.jsonl", batch)
    done = run_cli(server, "run", source, "-o", tmp_path / "out.jsonl", "--ordered")
    assert done.returncode == 1, done.stderr  # one line is not a chat request
    records = read_output(tmp_path / "out.jsonl")
    assert [r["custom_id"] for r in records] == [f"task-{i}" for i in range(5)] + ["task-bad"]
    assert records[0]["response"]["choices"][0]["message"]["content"] == "echo: item 0"
    assert records[0]["deployment"] == "gpt-test"
    assert (
        "only /v1/chat/completions, /v1/responses, /v1/messages and /v1/embeddings are supported"
        in records[5]["error"]["message"]
    )


def test_templates_over_csv(server: FakeServer, tmp_path: Path) -> None:
    source = tmp_path / "packages.csv"
    with source.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["package", "version"])
        writer.writerows([["requests", "2.32"], ["numpy", "2.1"], ["broken"], ["rich", "13"]])
    done = run_cli(
        server,
        "run",
        source,
        "-o",
        tmp_path / "out.jsonl",
        "--model",
        MODEL,
        "--ordered",
        "--template",
        "What is {package} {version}?",
        "--id-field",
        "package",
    )
    assert done.returncode == 1, done.stderr  # one row is broken
    records = read_output(tmp_path / "out.jsonl")
    assert [r["id"] for r in records] == ["requests", "numpy", "line-3", "rich"]
    assert records[0]["text"] == "echo: What is requests 2.32?"
    assert records[0]["metadata"] == {"package": "requests", "version": "2.32"}
    assert records[2]["error"]["message"] == "row 3 (line 4): has 1 fields, the header has 2"


def test_a_torn_last_line_is_repaired_not_duplicated(server: FakeServer, tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", questions(10))
    output = tmp_path / "out.jsonl"
    assert run_cli(server, "run", source, "-o", output, "--model", MODEL, "--ordered").returncode == 0
    text = output.read_text()
    cut = text[: len(text) - 40]  # the crash came in the middle of writing line 10
    output.write_text(cut)
    done = run_cli(server, "run", source, "-o", output, "--model", MODEL)
    assert done.returncode == 0, done.stderr
    records = read_output(output)
    assert sorted(r["line"] for r in records) == list(range(1, 11))
    assert server.stats.accepted == 10  # line 10 came back from the state, not the server
    assert "half-written" in done.stdout


def test_retry_failed_sends_failures_again(server: FakeServer, tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", questions(5))
    output = tmp_path / "out.jsonl"
    server.inject("400", times=1)
    assert (
        run_cli(server, "run", source, "-o", output, "--model", MODEL).returncode == 1
    )  # one record was rejected (400)
    assert sum(not r["ok"] for r in read_output(output)) == 1
    assert (
        run_cli(server, "run", source, "-o", output, "--model", MODEL).returncode == 1
    )  # the rejection is kept: still failed
    assert server.stats.received == 5  # the failure is kept, not resent
    done = run_cli(server, "run", source, "-o", output, "--model", MODEL, "--retry-failed")
    assert done.returncode == 0, done.stderr
    records = read_output(output)
    assert len(records) == 5
    assert all(r["ok"] for r in records)
    assert server.stats.received == 6


def test_identical_requests_are_served_from_the_state_unless_no_cache(server: FakeServer, tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", questions(5) + questions(5))
    assert run_cli(server, "run", source, "-o", tmp_path / "a.jsonl", "--model", MODEL).returncode == 0
    assert server.stats.accepted == 5
    records = read_output(tmp_path / "a.jsonl")
    assert sum(r["cached"] for r in records) == 5
    assert run_cli(server, "run", source, "-o", tmp_path / "b.jsonl", "--model", MODEL, "--no-cache").returncode == 0
    assert server.stats.accepted == 15


def test_sigint_finishes_in_flight_work_then_the_rerun_resumes(server: FakeServer, tmp_path: Path) -> None:
    server.latency = 0.05
    source = write_jsonl(tmp_path / "in.jsonl", questions(300))
    output = tmp_path / "out.jsonl"
    args = ["run", source, "-o", output, "--model", MODEL, "--concurrency", "5"]
    process = subprocess.Popen(
        sluice_cmd(*args), env=env_for(server), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    wait_until(lambda: server.stats.accepted >= 20)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 130
    assert "rerun the same command to resume" in stderr
    written = read_output(output)
    assert len(written) == server.stats.accepted  # every answered request was recorded
    server.latency = 0.0
    done = run_cli(server, *args)
    assert done.returncode == 0, done.stderr
    assert sorted(r["line"] for r in read_output(output)) == list(range(1, 301))
    assert server.stats.duplicate_successes == 0


def test_estimate_sends_nothing(server: FakeServer, tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", [*questions(600), {"messages": []}])
    done = run_cli(server, "estimate", source, "--model", MODEL, "--rpm", "300", "--tpm", "100000")
    assert done.returncode == 0, done.stderr
    assert "601" in done.stdout
    assert "600 requests" in done.stdout
    assert "2:00" in done.stdout  # 600 requests at 300/min
    assert "invalid records" in done.stdout
    assert server.stats.received == 0


def test_report_summarises_a_state_file(server: FakeServer, tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", questions(12))
    assert run_cli(server, "run", source, "-o", tmp_path / "out.jsonl", "--model", MODEL).returncode == 0
    done = run_cli(server, "report", tmp_path / "out.sluice.db")
    assert done.returncode == 0, done.stderr
    assert "finished" in done.stdout
    assert "12" in done.stdout
    assert "latency" in done.stdout
    by_output = run_cli(server, "report", tmp_path / "out.jsonl")  # the output names its job too
    assert by_output.returncode == 0, by_output.stderr
    assert by_output.stdout.splitlines()[0] == done.stdout.splitlines()[0]  # titled by the state it found
    assert by_output.stdout == done.stdout


def test_a_reader_that_leaves_early_is_not_a_bug(server: FakeServer, tmp_path: Path) -> None:
    """`sluice report ... | head`: the pipe closes before the table is written; that is an
    exit like `yes | head`'s, not an "internal error" with a traceback."""
    source = write_jsonl(tmp_path / "in.jsonl", questions(3))
    assert run_cli(server, "run", source, "-o", tmp_path / "out.jsonl", "--model", MODEL).returncode == 0
    process = subprocess.Popen(
        sluice_cmd("report", tmp_path / "out.jsonl"),
        env=env_for(server),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    process.stdout.close()  # the reader is gone before anything is written
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 141, stderr
    assert "Traceback" not in stderr
    assert "internal error" not in stderr


def test_config_file_is_validated_and_keys_masked(server: FakeServer, tmp_path: Path) -> None:
    config = tmp_path / "sluice.toml"
    config.write_text(
        f'model = "{MODEL}"\n[[deployment]]\nmodel = "{MODEL}"\nbase_url = "{server.url}"\n'
        'api_key_env = "MY_KEY"\nrpm = 600\n'
    )
    env = {**env_for(server), "MY_KEY": "sk-super-secret"}
    done = subprocess.run(sluice_cmd("config", "check", "--config", config), env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "$MY_KEY (set)" in done.stdout
    assert "sk-super-secret" not in done.stdout
    config.write_text(f'[[deployment]]\nmodel = "{MODEL}"\nrpm = "fast"\n')
    done = subprocess.run(sluice_cmd("config", "check", "--config", config), env=env, capture_output=True, text=True)
    assert done.returncode == 2
    assert "[[deployment]] #1: deployment 'openai/gpt-test': rpm must be a positive number, got 'fast'" in done.stderr
    config.write_text("model = \n")
    done = subprocess.run(sluice_cmd("config", "check", "--config", config), env=env, capture_output=True, text=True)
    assert done.returncode == 2
    assert "invalid TOML" in done.stderr


@pytest.mark.parametrize(
    ("content", "message"),
    [(b"", "is empty: there are no requests to run")],
)
def test_bad_files_get_a_clear_error(server: FakeServer, tmp_path: Path, content: bytes, message: str) -> None:
    source = tmp_path / "in.jsonl"
    source.write_bytes(content)
    done = run_cli(server, "run", source, "-o", tmp_path / "out.jsonl", "--model", MODEL)
    assert done.returncode == 2
    assert message in done.stderr


def test_missing_input_and_missing_model(server: FakeServer, tmp_path: Path) -> None:
    done = run_cli(server, "run", tmp_path / "nope.jsonl", "-o", tmp_path / "out.jsonl", "--model", MODEL)
    assert done.returncode == 2
    assert "no such input file" in done.stderr
    source = write_jsonl(tmp_path / "in.jsonl", questions(1))
    done = subprocess.run(
        sluice_cmd("run", source, "-o", tmp_path / "o.jsonl"), capture_output=True, text=True, cwd=tmp_path
    )
    assert done.returncode == 2, done.stderr  # no record can be sent: refused before anything is created
    assert "no model: none of the 1 records" in done.stderr
    assert "give --model" in done.stderr
    assert not (tmp_path / "o.jsonl").exists()


def test_a_budget_stops_the_job_and_a_larger_one_resumes_it(server: FakeServer, tmp_path: Path) -> None:
    server.prices = {"gpt-test": (2.0, 8.0)}
    source = write_jsonl(tmp_path / "in.jsonl", questions(40))
    output = tmp_path / "out.jsonl"
    common = ["run", source, "-o", output, "--model", MODEL, "--price", "2,8", "--concurrency", "4"]
    first = run_cli(server, *common, "--budget", "0.002")
    assert first.returncode == 4, first.stderr  # finished; some records could not be paid for
    assert "rerun with a larger --budget" in first.stderr
    records = read_output(output)
    done = [r for r in records if r["ok"]]
    exhausted = [r for r in records if not r["ok"]]
    assert len(records) == 40
    assert done
    assert exhausted
    assert all(r["error"]["type"] == "budget_exhausted" for r in exhausted)
    assert sum(r["cost_usd"] for r in done) <= 0.002
    assert sum(r["cost_usd"] for r in done) == pytest.approx(server.total_billed_usd)

    second = run_cli(server, *common, "--budget", "1")
    assert second.returncode == 0, second.stderr
    records = read_output(output)
    assert sorted(r["line"] for r in records) == list(range(1, 41))
    assert all(r["ok"] for r in records)
    assert server.stats.accepted == 40  # the first run's answers were not bought again
    assert "in all" in second.stdout
    report = run_cli(server, "report", tmp_path / "out.sluice.db")
    assert f"${server.total_billed_usd:,.4f}" in report.stdout


def test_a_budget_refuses_models_with_no_price(server: FakeServer, tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", questions(2))
    done = run_cli(server, "run", source, "-o", tmp_path / "out.jsonl", "--model", MODEL, "--budget", "1")
    assert done.returncode == 2, done.stderr  # refused before anything starts
    assert "has no known price" in done.stderr
    assert "--allow-unpriced" in done.stderr or "allow unpriced" in done.stderr
    assert server.stats.received == 0
    done = run_cli(
        server, "run", source, "-o", tmp_path / "out.jsonl", "--model", MODEL, "--budget", "1", "--allow-unpriced"
    )
    assert all(r["ok"] for r in read_output(tmp_path / "out.jsonl"))
    assert "no known price" in done.stdout


def test_estimate_gives_a_cost_range(server: FakeServer, tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", questions(100))
    done = run_cli(server, "estimate", source, "--model", "openai/gpt-4o-mini", "--expected-output", "10")
    assert done.returncode == 0, done.stderr
    assert "(prompts only) .." in done.stdout
    assert "(every max_tokens used)" in done.stdout
    assert "at 10 output tokens each" in done.stdout
    unknown = run_cli(server, "estimate", source, "--model", MODEL)
    assert "unknown: no price for this model" in unknown.stdout


def test_the_estimate_prices_each_request_on_its_own_not_the_whole_job_as_one(
    server: FakeServer, tmp_path: Path
) -> None:
    """Claude Sonnet 4.5 doubles its input price past 200,000 prompt tokens *in a request*:
    100 lines of ~3,000 tokens are 300,000 tokens in all, each line at the base price (the
    cost row once priced the job's sum as one request: twice the cost)."""
    lines = [{"messages": [{"role": "user", "content": f"{n} " + "lorem ipsum " * 2_000}]} for n in range(100)]
    source = write_jsonl(tmp_path / "in.jsonl", lines)
    args = ["estimate", source, "--model", "anthropic/claude-sonnet-4-5", "--prompt-cache", "off"]
    figures = json.loads(run_cli(server, *args, "--json", "--expected-output", "0").stdout)
    prompt = figures["input_tokens"]
    assert prompt > 200_000
    assert figures["cost_usd_without_cache"] == pytest.approx(prompt * 3.0 / 1e6, rel=1e-3)
    done = run_cli(server, *args)
    assert done.returncode == 0, done.stderr
    cost = re.search(r"\n\s+cost\s+\$([\d.,]+) \(prompts only\)", done.stdout)
    assert cost is not None, done.stdout
    assert float(cost.group(1).replace(",", "")) == pytest.approx(prompt * 3.0 / 1e6, abs=1e-4)
    batch = re.search(r"cost, --tier batch\s+\$([\d.,]+) \(prompts only\)", done.stdout)
    assert batch is not None
    assert float(batch.group(1).replace(",", "")) == pytest.approx(prompt * 1.5 / 1e6, abs=1e-4)


def test_a_huge_line_is_an_error_for_that_line_only(server: FakeServer, tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    huge = json.dumps({"messages": [{"role": "user", "content": "x" * (9 * 1024 * 1024)}]})
    source.write_text("\n".join([json.dumps(questions(1)[0]), huge, json.dumps(questions(2)[1])]) + "\n")
    done = run_cli(server, "run", source, "-o", tmp_path / "out.jsonl", "--model", MODEL, "--ordered")
    assert done.returncode == 1, done.stderr  # the huge line failed
    records = read_output(tmp_path / "out.jsonl")
    assert [r["ok"] for r in records] == [True, False, True]
    assert records[1]["error"]["message"] == "line 2 is longer than 8,388,608 bytes"


def test_a_second_sigint_aborts_at_once_and_the_state_stays_consistent(server: FakeServer, tmp_path: Path) -> None:
    server.latency = 2.0  # in-flight requests would take a long time to finish
    source = write_jsonl(tmp_path / "in.jsonl", questions(50))
    output = tmp_path / "out.jsonl"
    args = ["run", source, "-o", output, "--model", MODEL, "--concurrency", "5"]
    process = subprocess.Popen(
        sluice_cmd(*args), env=env_for(server), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    wait_until(lambda: server.stats.received >= 5)
    process.send_signal(signal.SIGINT)
    time.sleep(0.3)
    process.send_signal(signal.SIGINT)
    process.communicate(timeout=30)
    assert process.returncode == 130
    assert not output.exists() or not read_output(output)  # it did not wait for the 2 s answers
    server.latency = 0.0
    done = run_cli(server, *args)
    assert done.returncode == 0, done.stderr
    assert sorted(r["line"] for r in read_output(output)) == list(range(1, 51))


def test_the_estimate_brackets_the_actual_cost_of_a_real_run(server: FakeServer, tmp_path: Path) -> None:
    import re

    server.prices = {"gpt-test": (2.0, 8.0)}
    source = write_jsonl(tmp_path / "in.jsonl", questions(50))
    estimate = run_cli(server, "estimate", source, "--model", MODEL, "--price", "2,8")
    assert estimate.returncode == 0, estimate.stderr
    (sync,) = [line for line in estimate.stdout.splitlines() if line.strip().startswith("cost ")]
    low, high = (float(x) for x in re.findall(r"\$([0-9.]+) \((?:prompts only|every max_tokens used)\)", sync))
    (batch,) = [line for line in estimate.stdout.splitlines() if "cost, --tier batch" in line]
    assert [float(x) for x in re.findall(r"\$([0-9.]+) \(", batch)] == pytest.approx([low / 2, high / 2], abs=1e-4)
    done = run_cli(server, "run", source, "-o", tmp_path / "out.jsonl", "--model", MODEL, "--price", "2,8")
    assert done.returncode == 0, done.stderr
    actual = sum(r["cost_usd"] for r in read_output(tmp_path / "out.jsonl"))
    assert actual == pytest.approx(server.total_billed_usd)
    assert low <= actual <= high
