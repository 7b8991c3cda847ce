"""Issue 7: the files of a batch job. sluice never destroys what it did not write, refuses
paths that cannot work with a clear message, keeps or redoes each earlier record for a
reason it can state, and tells a script what happened through its exit status."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from clitools import MODEL, env_for, questions, read_output, run_cli, start_cli, wait_until, write_jsonl

from sluice import ConfigError
from sluice.testing import FakeServer

# -- point 1: -o never destroys what sluice did not write ------------------------------------


def test_an_unrelated_output_file_is_refused_and_left_intact(server: FakeServer, tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", questions(3))
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\nnot sluice's\n")
    for extra in ([], ["--restart"]):
        done = run_cli(server, "run", source, "-o", notes, "--model", MODEL, *extra)
        assert done.returncode == 2, done.stderr
        assert str(notes) in done.stderr
        assert "--overwrite" in done.stderr
        assert notes.read_text() == "my notes\nnot sluice's\n"
    assert server.stats.received == 0


def test_a_symlinked_output_is_refused_without_touching_link_or_target(server: FakeServer, tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", questions(3))
    target = tmp_path / "precious.jsonl"
    target.write_text('{"mine": true}\n')
    link = tmp_path / "out.jsonl"
    link.symlink_to(target)
    done = run_cli(server, "run", source, "-o", link, "--model", MODEL)
    assert done.returncode == 2, done.stderr
    assert link.is_symlink()
    assert target.read_text() == '{"mine": true}\n'


def test_overwrite_replaces_an_unrelated_output(server: FakeServer, tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", questions(3))
    notes = tmp_path / "notes.jsonl"
    notes.write_text("old\n")
    done = run_cli(server, "run", source, "-o", notes, "--model", MODEL, "--overwrite")
    assert done.returncode == 0, done.stderr
    assert sorted(r["line"] for r in read_output(notes)) == [1, 2, 3]


def test_the_state_must_be_a_file_of_its_own(server: FakeServer, tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", questions(3))
    output = tmp_path / "out.jsonl"
    for state in (source, output):
        done = run_cli(server, "run", source, "-o", output, "--model", MODEL, "--state", state)
        assert done.returncode == 2, done.stderr
        assert "--state" in done.stderr
    assert source.read_text() == "".join(json.dumps(q) + "\n" for q in questions(3))
    assert server.stats.received == 0


def test_an_output_whose_state_is_gone_is_refused_and_can_be_adopted(server: FakeServer, tmp_path: Path) -> None:
    """Point 17: deleting (or emptying) the state does not hand out a fresh budget."""
    server.prices = {"gpt-test": (2.0, 8.0)}
    source = write_jsonl(tmp_path / "in.jsonl", questions(40))
    output = tmp_path / "out.jsonl"
    common = ["run", source, "-o", output, "--model", MODEL, "--price", "2,8", "--concurrency", "4", "--budget"]
    first = run_cli(server, *common, "0.002")
    assert first.returncode == 4, first.stderr  # the budget stopped it part-way
    billed = server.total_billed_usd
    state = tmp_path / "out.sluice.db"
    for emptied in (False, True):
        for leftover in tmp_path.glob("out.sluice.db*"):
            leftover.unlink()
        if emptied:
            state.write_bytes(b"")  # zeroed, not deleted
        done = run_cli(server, *common, "0.002")
        assert done.returncode == 2, done.stderr
        assert "does not know it" in done.stderr
        assert "--adopt-output" in done.stderr
    adopted = run_cli(server, *common, "0.002", "--adopt-output")
    assert adopted.returncode == 4, adopted.stderr
    assert server.total_billed_usd == pytest.approx(billed)  # the records' cost still counts
    assert server.total_billed_usd <= 0.002


# -- point 16: clear errors, not tracebacks --------------------------------------------------


def test_paths_that_cannot_work_are_clear_errors(server: FakeServer, tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", questions(2))
    done = run_cli(server, "run", source, "-o", tmp_path, "--model", MODEL)
    assert done.returncode == 2
    assert "is a directory" in done.stderr
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    done = run_cli(server, "run", source, "-o", blocker / "out.jsonl", "--model", MODEL)
    assert done.returncode == 2
    assert "does not exist; create it first" in done.stderr
    for result in (done,):
        assert "Traceback" not in result.stderr


def test_two_jobs_on_one_output_with_different_states_are_refused(server: FakeServer, tmp_path: Path) -> None:
    server.latency = 0.05
    source = write_jsonl(tmp_path / "in.jsonl", questions(60))
    output = tmp_path / "out.jsonl"
    first = start_cli(server, "run", source, "-o", output, "--model", MODEL, "--concurrency", "2")
    try:
        wait_until(lambda: server.stats.received >= 2)
        second = run_cli(server, "run", source, "-o", output, "--model", MODEL, "--state", tmp_path / "other.db")
        assert second.returncode == 2, second.stderr
        assert str(output) in second.stderr
        _, stderr = first.communicate(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, stderr
    assert sorted(r["line"] for r in read_output(output)) == list(range(1, 61))


def test_a_damaged_state_is_a_clear_error(server: FakeServer, tmp_path: Path) -> None:
    """Point 22: scribbled pages are found when the state is opened."""
    source = write_jsonl(tmp_path / "in.jsonl", questions(200))
    output = tmp_path / "out.jsonl"
    assert run_cli(server, "run", source, "-o", output, "--model", MODEL).returncode == 0
    state = tmp_path / "out.sluice.db"
    data = bytearray(state.read_bytes())
    assert len(data) > 8192
    data[4096:6144] = os.urandom(2048)  # the second page and more
    state.write_bytes(bytes(data))
    done = run_cli(server, "run", source, "-o", output, "--model", MODEL)
    assert done.returncode == 2, done.stderr
    assert "not a usable sluice state file" in done.stderr
    assert "Traceback" not in done.stderr


def test_ctrl_c_while_starting_is_quiet(server: FakeServer, tmp_path: Path) -> None:
    """Point 22: a Ctrl-C in the first tenth of a second is no traceback."""
    source = write_jsonl(tmp_path / "in.jsonl", questions(5))
    # a warm start, as a user's: a first run with a cold bytecode cache spends its first
    # 60 ms compiling the interpreter's own start-up, before any of sluice can run
    assert run_cli(server, "--version").returncode == 0
    landed = 0
    for delay in (0.06, 0.1, 0.15) * 4:  # after the interpreter itself has started (~20 ms)
        process = start_cli(server, "run", source, "-o", tmp_path / f"out-{delay}.jsonl", "--model", MODEL)
        time.sleep(delay)
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=30)
        if "Fatal Python error: init_import_site" in stderr or (process.returncode == -signal.SIGINT and not stderr):
            # Python's own start-up (loading the interpreter, before it has a SIGINT handler;
            # site's .pth files, before any of sluice is read) took longer than the delay: a
            # loaded machine; not this promise's, so try again
            continue
        assert "Traceback" not in stderr
        assert "KeyboardInterrupt" not in stderr
        assert process.returncode in (0, 130), stderr
        landed += 1
        if landed == 3:
            break
    assert landed >= 1, "every Ctrl-C landed in the interpreter's own start-up"


# -- points 12, 13, 14: what a rerun keeps, what it redoes, and the exit status ----------------


def test_a_plain_rerun_redoes_what_was_not_the_requests_fault(server: FakeServer, tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", questions(6))
    output = tmp_path / "out.jsonl"
    config = tmp_path / "sluice.toml"
    config.write_text("[retry]\nmax_attempts = 1\n")
    args = ["run", source, "-o", output, "--model", MODEL, "--config", config, "--ordered"]
    server.inject("400", times=1)
    server.inject("503", times=1)
    first = run_cli(server, *args)
    assert first.returncode == 1, first.stderr  # finished, with failures
    assert "bad_request" in first.stderr
    assert "a plain rerun redoes them" in first.stderr
    kinds = sorted(r["error"]["type"] for r in read_output(output) if not r["ok"])
    assert kinds == ["bad_request", "server_error"]
    second = run_cli(server, *args)
    assert second.returncode == 1, second.stderr  # the rejection is kept: not every record succeeded
    assert "1 failures from earlier runs were kept" in second.stderr
    assert server.stats.received == 7  # only the server's failure was sent again
    records = read_output(output)
    assert sum(not r["ok"] for r in records) == 1
    third = run_cli(server, *args, "--retry-failed")
    assert third.returncode == 0, third.stderr
    assert all(r["ok"] for r in read_output(output))


def test_a_request_too_large_for_the_provider_is_kept_like_a_400(server: FakeServer, tmp_path: Path) -> None:
    """Issue 34 point 27: a 413 (the body is over what the provider takes) can never fit:
    it is final, and a plain rerun keeps it rather than sending it again."""
    source = write_jsonl(tmp_path / "in.jsonl", questions(3))
    output = tmp_path / "out.jsonl"
    args = ["run", source, "-o", output, "--model", MODEL, "--concurrency", "1", "--ordered"]
    server.inject("413", times=1)
    first = run_cli(server, *args)
    assert first.returncode == 1, first.stderr
    (failed,) = [r for r in read_output(output) if not r["ok"]]
    assert (failed["line"], failed["error"]["status"], failed["error"]["type"]) == (1, 413, "bad_request")
    assert failed["attempts"] == 1  # not retried either
    received = server.stats.received
    second = run_cli(server, *args)
    assert second.returncode == 1, second.stderr
    assert "1 failures from earlier runs were kept" in second.stderr
    assert server.stats.received == received


def test_a_custom_id_in_a_bare_body_is_the_lines_id(server: FakeServer, tmp_path: Path) -> None:
    """Point 27: a ``custom_id`` beside ``messages`` (or in a bare Responses body) names the
    line's record, as in a Batch API line, and is not sent to the provider; without it the
    id is the request's hash, as before."""
    lines = [
        {"custom_id": "q-1", "messages": [{"role": "user", "content": "one"}], "max_tokens": 20},
        {"custom_id": "q-2", "model": MODEL, "input": "two", "max_output_tokens": 20},
        {"messages": [{"role": "user", "content": "three"}], "max_tokens": 20},
        {"custom_id": 7, "messages": [{"role": "user", "content": "four"}], "max_tokens": 20},
    ]
    source = write_jsonl(tmp_path / "in.jsonl", lines)
    output = tmp_path / "out.jsonl"
    done = run_cli(server, "run", source, "-o", output, "--model", MODEL)
    by_line = {r["line"]: r for r in read_output(output)}
    assert (by_line[1]["id"], by_line[1]["custom_id"], by_line[1]["ok"]) == ("q-1", "q-1", True)
    assert (by_line[2]["id"], by_line[2]["custom_id"], by_line[2]["ok"]) == ("q-2", "q-2", True)
    assert "custom_id" not in by_line[3]
    assert not by_line[4]["ok"]
    assert "custom_id must be a non-empty string" in by_line[4]["error"]["message"]
    assert done.returncode == 1, done.stderr
    from sluice.batch._inputs import InputOptions, read_inputs

    sent = [item.request for item in read_inputs(source, InputOptions(model=MODEL)) if item.request is not None]
    assert [r.id for r in sent] == ["q-1", "q-2", None]
    assert not any("custom_id" in r.params for r in sent)  # what goes to the provider: no such field
    assert sent[1].native is not None
    assert "custom_id" not in sent[1].native.body


def test_an_input_edited_in_place_is_noticed(server: FakeServer, tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", questions(5))
    output = tmp_path / "out.jsonl"
    assert run_cli(server, "run", source, "-o", output, "--model", MODEL).returncode == 0
    edited = questions(5)
    edited[2]["messages"][0]["content"] = "a different question"
    write_jsonl(source, edited)
    done = run_cli(server, "run", source, "-o", output, "--model", MODEL)
    assert done.returncode == 0, done.stderr
    assert "1 lines changed in the input" in done.stderr
    assert server.stats.received == 6
    by_line = {r["line"]: r for r in read_output(output)}
    assert len(by_line) == 5
    assert by_line[3]["text"] == "echo: a different question"


def test_a_job_that_cannot_work_says_so_at_once(server: FakeServer, tmp_path: Path) -> None:
    """Point 11: a missing key is an error before anything starts."""
    source = write_jsonl(tmp_path / "in.jsonl", questions(100))
    config = tmp_path / "sluice.toml"
    config.write_text(
        f'[[deployment]]\nmodel = "{MODEL}"\nbase_url = "{server.url}"\napi_key_env = "SLUICE_TEST_MISSING_KEY"\n'
    )
    env = env_for(server)
    env.pop("SLUICE_TEST_MISSING_KEY", None)
    done = run_cli(server, "run", source, "-o", tmp_path / "out.jsonl", "--config", config, env=env)
    assert done.returncode == 2, done.stderr
    assert "SLUICE_TEST_MISSING_KEY" in done.stderr
    assert server.stats.received == 0


@pytest.mark.parametrize("how", ["wrong key", "connection refused"])
def test_a_job_whose_first_requests_all_fail_the_same_way_stops_early(
    server: FakeServer, tmp_path: Path, how: str
) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", questions(300))
    config = tmp_path / "sluice.toml"
    config.write_text("[retry]\nmax_attempts = 1\n")
    env = env_for(server, OPENAI_API_KEY="sk-wrong")
    if how == "connection refused":
        env = env_for(server, OPENAI_BASE_URL="http://127.0.0.1:9/v1")
    args = ["run", source, "-o", tmp_path / "out.jsonl", "--model", MODEL, "--concurrency", "4", "--config", config]
    done = run_cli(server, *args, env=env)
    assert done.returncode == 3, done.stderr
    assert "the first 10 requests all failed the same way" in done.stderr
    kind = "authentication_error" if how == "wrong key" else "connection_error"
    assert kind in done.stderr
    assert server.stats.received <= 14  # ten, and at most the concurrency more in flight
    assert "sk-wrong" not in done.stderr + done.stdout


def test_exit_status_and_summary_tell_a_script_what_happened(server: FakeServer, tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", questions(4))
    ok = run_cli(server, "run", source, "-o", tmp_path / "a.jsonl", "--model", MODEL)
    assert ok.returncode == 0, ok.stderr
    write_jsonl(source, [*questions(4), {"messages": "not a list"}])
    failed = run_cli(server, "run", source, "-o", tmp_path / "b.jsonl", "--model", MODEL)
    assert failed.returncode == 1
    assert "invalid_input" in failed.stderr
    assert "needs the line fixed" in failed.stderr
    help_text = run_cli(server, "run", "--help").stdout
    for code in ("0 ", "1 ", "2 ", "3 ", "4 ", "130"):
        assert code in help_text


def test_a_rerun_with_a_larger_budget_does_what_the_smaller_could_not(server: FakeServer, tmp_path: Path) -> None:
    """Point 5: budget_exhausted (and every other not-the-request's-fault failure) is redone."""
    server.prices = {"gpt-test": (2.0, 8.0)}
    source = write_jsonl(tmp_path / "in.jsonl", questions(30))
    output = tmp_path / "out.jsonl"
    common = ["run", source, "-o", output, "--model", MODEL, "--price", "2,8", "--concurrency", "3"]
    assert run_cli(server, *common, "--budget", "0.001").returncode == 4
    exhausted = [r for r in read_output(output) if not r["ok"]]
    assert exhausted
    assert all(r["error"]["type"] == "budget_exhausted" for r in exhausted)
    done = run_cli(server, *common, "--budget", "1")
    assert done.returncode == 0, done.stderr
    assert all(r["ok"] for r in read_output(output))
    assert server.stats.duplicate_successes == 0


def test_money_is_shown_with_enough_digits() -> None:
    from sluice.cli._progress import usd

    assert usd(0.000042) == "$0.000042"
    assert usd(0.0000042) == "$0.0000042"
    assert usd(0.0123) == "$0.0123"
    assert usd(12.5) == "$12.50"
    assert usd(0) == "$0.00"


def test_under_a_budget_an_uncapped_answer_is_never_silently_cut(server: FakeServer, tmp_path: Path) -> None:
    """Point 3: a budget needs an output cap; the record says the engine set one."""
    source = write_jsonl(
        tmp_path / "in.jsonl", [{"messages": [{"role": "user", "content": f"tell me {i}"}]} for i in range(3)]
    )
    config = tmp_path / "sluice.toml"
    config.write_text(
        f'model = "{MODEL}"\n[[deployment]]\nmodel = "{MODEL}"\ndefault_max_tokens = 5\n'
        "price = { input_per_mtok = 2.0, output_per_mtok = 8.0 }\n"
    )
    output = tmp_path / "out.jsonl"
    done = run_cli(server, "run", source, "-o", output, "--config", config, "--budget", "1")
    assert done.returncode == 0, done.stderr
    records = read_output(output)
    assert [r["max_tokens_added"] for r in records] == [5, 5, 5]
    assert {r["finish_reason"] for r in records} == {"length"}
    assert "3 answers were cut at the max_tokens the budget required" in done.stderr
    unbudgeted = run_cli(server, "run", source, "-o", tmp_path / "free.jsonl", "--config", config)
    assert unbudgeted.returncode == 0, unbudgeted.stderr
    assert all("max_tokens_added" not in r for r in read_output(tmp_path / "free.jsonl"))


@pytest.mark.parametrize("flag", ["--adopt-output", "--overwrite"])
def test_no_flag_lets_a_second_job_write_an_output_in_use(server: FakeServer, tmp_path: Path, flag: str) -> None:
    # Slow answers keep the first job running however long the second takes to start on a loaded
    # machine (60 lines, two at a time, 0.5 s each: 15 s); once the second is refused, answers come at once.
    server.latency = 0.5
    source = write_jsonl(tmp_path / "in.jsonl", questions(60))
    output = tmp_path / "out.jsonl"
    first = start_cli(server, "run", source, "-o", output, "--model", MODEL, "--concurrency", "2")
    try:
        wait_until(lambda: server.stats.accepted >= 4)
        second = run_cli(server, "run", source, "-o", output, "--model", MODEL, "--state", tmp_path / "b.db", flag)
        assert first.poll() is None, "the first job ended before the second was tried; the test proves nothing"
        server.latency = 0
        assert second.returncode == 2, second.stderr
        assert "being written by another sluice job" in second.stderr
        _, stderr = first.communicate(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, stderr
    assert sorted(r["line"] for r in read_output(output)) == list(range(1, 61))
    assert server.stats.duplicate_successes == 0


def test_a_second_run_on_the_same_output_is_refused(tmp_path: Path) -> None:
    from sluice.batch._runner import exclusive

    state = tmp_path / "out.sluice.db"
    with exclusive(state), pytest.raises(ConfigError, match="in use by a running sluice job"), exclusive(state):
        pass


def test_dropping_records_never_follows_a_symlink_beside_the_output(server: FakeServer, tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", questions(4))
    output = tmp_path / "out.jsonl"
    server.inject("400", times=1)
    assert run_cli(server, "run", source, "-o", output, "--model", MODEL).returncode == 1
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    for name in ("out.jsonl.rewrite", "out.jsonl.tmp"):
        (tmp_path / name).symlink_to(victim)
    done = run_cli(server, "run", source, "-o", output, "--model", MODEL, "--retry-failed")
    assert done.returncode == 0, done.stderr
    assert victim.read_text() == "precious\n"
    assert not output.is_symlink()
    assert sorted(r["line"] for r in read_output(output)) == [1, 2, 3, 4]


def test_records_for_lines_the_input_does_not_have_are_dropped(server: FakeServer, tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", questions(3))
    output = tmp_path / "out.jsonl"
    assert run_cli(server, "run", source, "-o", output, "--model", MODEL).returncode == 0
    with output.open("a") as f:
        for line in (-1, 0, 10**10):
            f.write(json.dumps({"line": line, "ok": True, "text": "stray"}) + "\n")
    done = run_cli(server, "run", source, "-o", output, "--model", MODEL)
    assert done.returncode == 0, done.stderr
    assert sorted(r["line"] for r in read_output(output)) == [1, 2, 3]
    assert "3/3" in done.stderr or "3 (" in done.stdout


def test_an_output_that_cannot_be_opened_is_a_clear_error(server: FakeServer, tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", questions(2))
    output = tmp_path / "out.jsonl"
    assert run_cli(server, "run", source, "-o", output, "--model", MODEL).returncode == 0
    output.chmod(0o444)
    try:
        done = run_cli(server, "run", source, "-o", output, "--model", MODEL, "--retry-failed")
    finally:
        output.chmod(0o644)
    if os.geteuid() == 0:  # root may write a read-only file: then it simply resumes
        assert done.returncode == 0, done.stderr
    else:
        assert done.returncode == 2, done.stderr
        assert "cannot open the output" in done.stderr
    assert "Traceback" not in done.stderr
