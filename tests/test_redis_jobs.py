"""Distributed jobs (issue 10): ``sluice run --redis`` coordinates, ``sluice worker``s
answer, against a real redis-server and the fake provider over loopback. Every line ends
with exactly one record whatever dies or restarts; duplicates at the provider are bounded
by what a dead worker had in flight; no API key ever reaches Redis."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from clitools import MODEL, questions, read_output, run_cli, start_cli, wait_until, write_jsonl
from redis_server import RedisServer

from sluice.testing import FakeServer

KEY = "sk-test-distributed-9f3c"


@pytest.fixture
def api_key() -> str:
    """The key the conftest ``server`` requires here."""
    return KEY


def _env(server: FakeServer) -> dict[str, str]:
    from clitools import env_for

    return env_for(server, OPENAI_API_KEY=KEY)


def _worker(server: FakeServer, redis_server: RedisServer, *args: str) -> subprocess.Popen[str]:
    return start_cli(server, "worker", "--redis", redis_server.url, *args, env=_env(server), stdout=subprocess.DEVNULL)


def _stop(worker: subprocess.Popen[str]) -> tuple[int, str]:
    if worker.poll() is None:
        worker.send_signal(signal.SIGTERM)
    try:
        _, err = worker.communicate(timeout=30)
    finally:
        if worker.poll() is None:
            worker.kill()
    return worker.returncode, err or ""


def _kill(process: subprocess.Popen[str]) -> None:
    """SIGKILL (if still running), and its pipes closed."""
    if process.poll() is None:
        process.send_signal(signal.SIGKILL)
    process.communicate(timeout=10)


def _lines(path: Path) -> list[int]:
    return sorted(record["line"] for record in read_output(path))


def _duplicates(server: FakeServer) -> int:
    """Requests the fake received beyond one per distinct request (every line differs)."""
    return sum(count - 1 for count in server.stats.by_key.values())


def _client(redis_server: RedisServer) -> redis.Redis:
    return redis.Redis.from_url(redis_server.url)


def _job_id(client: redis.Redis) -> str:
    wait_until(lambda: bool(client.smembers("sluice:jobs")), timeout=20)
    members: Any = client.smembers("sluice:jobs")
    return str(next(iter(members)).decode())


def _run_args(source: Path, out: Path, redis_server: RedisServer, *extra: str) -> list[str | Path]:
    return ["run", source, "-o", out, "--model", MODEL, "--redis", redis_server.url, "--log-every", "1", *extra]


def test_a_coordinator_and_two_workers_write_one_record_per_line_and_no_key_reaches_redis(
    server: FakeServer, redis_server: RedisServer, tmp_path: Path
) -> None:
    server.latency = 0.02
    source = write_jsonl(tmp_path / "in.jsonl", questions(300))
    out = tmp_path / "out.jsonl"
    workers = [_worker(server, redis_server, "--concurrency", "4", "--name", f"w{i}") for i in (1, 2)]
    try:
        client = _client(redis_server)
        wait_until(lambda: client.scard("sluice:workers") == 2, timeout=30)  # both up before the job
        run = run_cli(server, *_run_args(source, out, redis_server, "--concurrency", "4"), env=_env(server))
    finally:
        stopped = [_stop(worker) for worker in workers]
    assert run.returncode == 0, run.stderr
    assert _lines(out) == list(range(1, 301))
    assert all(record["ok"] for record in read_output(out))
    assert server.stats.received <= 300  # nothing sent twice
    assert [code for code, _ in stopped] == [0, 0], stopped
    answered = next(line for line in run.stdout.splitlines() if "answered by" in line)
    assert "w1 " in answered, answered  # both workers took part
    assert "w2 " in answered, answered
    client = _client(redis_server)
    assert not client.smembers("sluice:jobs")  # finished: workers leave, its keys are gone
    assert not client.keys("sluice:job:*:*")
    # Every write Redis took is in its append-only file: the prompts went through, the key never.
    written = b"".join(p.read_bytes() for p in redis_server.directory.rglob("*.aof"))
    assert b"question 17" in written
    assert KEY.encode() not in written
    assert b"sk-test" not in written


def test_the_request_stream_holds_at_most_a_window_of_the_input(
    server: FakeServer, redis_server: RedisServer, tmp_path: Path
) -> None:
    """Fed as it drains: with one worker taking 2 at once, at most max(16, 2 x 2) entries
    are ever in Redis, however long the file."""
    server.latency = 0.01
    source = write_jsonl(tmp_path / "in.jsonl", questions(150))
    out = tmp_path / "out.jsonl"
    coordinator = start_cli(server, *_run_args(source, out, redis_server, "--no-local-worker"), env=_env(server))
    worker = _worker(server, redis_server, "--concurrency", "2")
    seen: list[int] = []
    try:
        client = _client(redis_server)
        stream = f"sluice:job:{_job_id(client)}:requests"
        while coordinator.poll() is None:
            seen.append(client.xlen(stream))
            time.sleep(0.005)
        _, err = coordinator.communicate(timeout=60)
    finally:
        _kill(coordinator)
        _stop(worker)
    assert coordinator.returncode == 0, err
    assert _lines(out) == list(range(1, 151))
    assert 2 < max(seen) <= 16


def test_a_worker_killed_mid_job_loses_nothing_and_duplicates_stay_within_its_in_flight(
    server: FakeServer, redis_server: RedisServer, tmp_path: Path
) -> None:
    server.latency = 0.5
    source = write_jsonl(tmp_path / "in.jsonl", questions(40))
    out = tmp_path / "out.jsonl"
    args = _run_args(source, out, redis_server, "--no-local-worker", "--claim-after", "2")
    coordinator = start_cli(server, *args, env=_env(server))
    doomed = _worker(server, redis_server, "--concurrency", "8", "--name", "doomed")
    survivor: subprocess.Popen[str] | None = None
    try:
        wait_until(lambda: server.in_flight >= 8, timeout=30)
        _kill(doomed)  # eight requests at the provider, their entries pending with a dead worker
        server.latency = 0.0  # (those eight still take theirs)
        survivor = _worker(server, redis_server, "--concurrency", "8", "--name", "survivor")
        _, err = coordinator.communicate(timeout=60)
    finally:
        for process in (coordinator, doomed):
            _kill(process)
        if survivor is not None:
            _stop(survivor)
    assert coordinator.returncode == 0, err
    assert _lines(out) == list(range(1, 41))
    assert 0 < _duplicates(server) <= 8  # only what the dead worker had in flight is sent again


def test_a_line_already_answered_is_not_sent_again_when_redelivered(
    server: FakeServer, redis_server: RedisServer, tmp_path: Path
) -> None:
    """A worker answered a line (its result and the done-set say so) and died before
    acknowledging the entry; the worker that claims the entry checks the done-set first."""
    server.latency = 1.0  # the job is not over (and its stream gone) before the claim
    source = write_jsonl(tmp_path / "in.jsonl", questions(10))  # all fed at once (the window is 16)
    out = tmp_path / "out.jsonl"
    args = _run_args(source, out, redis_server, "--no-local-worker", "--claim-after", "0.5")
    coordinator = start_cli(server, *args, env=_env(server))
    worker: subprocess.Popen[str] | None = None
    try:
        client = _client(redis_server)
        base = f"sluice:job:{_job_id(client)}"
        wait_until(lambda: client.xlen(f"{base}:requests") == 10, timeout=20)
        reply: Any = client.xreadgroup("workers", "ghost", {f"{base}:requests": ">"}, count=1)
        _, fields = reply[0][1][0]
        line = int(fields[b"line"])
        record = {"line": line, "id": "ghost", "ok": True, "text": "answered by the ghost", "error": None}
        client.xadd(
            f"{base}:results", {"line": line, "key": fields[b"key"], "worker": "ghost", "out": json.dumps(record)}
        )
        client.sadd(f"{base}:done", line)  # ... and died before its XACK
        worker = _worker(server, redis_server, "--concurrency", "4")
        _, err = coordinator.communicate(timeout=60)
    finally:
        _kill(coordinator)
        if worker is not None:
            _stop(worker)
    assert coordinator.returncode == 0, err
    assert _lines(out) == list(range(1, 11))
    texts = {record["line"]: record["text"] for record in read_output(out)}
    assert texts[line] == "answered by the ghost"
    assert server.stats.received == 9  # every line but the ghost's, once


def test_a_poison_request_becomes_a_dead_letter_with_its_last_error(
    server: FakeServer, redis_server: RedisServer, tmp_path: Path
) -> None:
    """A request that fails on every worker (here: its model's server refuses connections)
    goes round the workers max_deliveries times, then is written as an error record."""
    config = tmp_path / "sluice.toml"
    config.write_text(
        "[retry]\nmax_attempts = 1\n\n"
        '[[deployment]]\nmodel = "openai/poison"\nbase_url = "http://127.0.0.1:9/v1"\napi_key_env = "OPENAI_API_KEY"\n'
    )
    records = questions(10)
    records[3]["model"] = "openai/poison"
    source = write_jsonl(tmp_path / "in.jsonl", records)
    out = tmp_path / "out.jsonl"
    args = _run_args(source, out, redis_server, "--config", config, "--claim-after", "0.5", "--max-deliveries", "3")
    worker = _worker(server, redis_server, "--concurrency", "2", "--config", str(config))
    try:
        run = run_cli(server, *args, "--concurrency", "2", env=_env(server))
    finally:
        _stop(worker)
    assert run.returncode == 1, run.stderr
    by_line = {record["line"]: record for record in read_output(out)}
    assert sorted(by_line) == list(range(1, 11))
    poison = by_line[4]
    assert poison["ok"] is False
    assert poison["error"]["type"] == "connection_error"
    assert "dead letter: delivered 3 times" in poison["error"]["message"]
    assert all(record["ok"] for line, record in by_line.items() if line != 4)
    assert server.stats.received == 9


def test_a_coordinator_killed_and_rerun_resumes_without_sending_answered_lines_again(
    server: FakeServer, redis_server: RedisServer, tmp_path: Path
) -> None:
    server.latency = 0.2
    source = write_jsonl(tmp_path / "in.jsonl", questions(80))
    out = tmp_path / "out.jsonl"
    args = _run_args(source, out, redis_server, "--concurrency", "4", "--claim-after", "1")
    worker = _worker(server, redis_server, "--concurrency", "4", "--name", "steady")
    try:
        first = start_cli(server, *args, env=_env(server), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(lambda: out.exists() and len(out.read_bytes().splitlines()) >= 20, timeout=30)
        _kill(first)
        client = _client(redis_server)
        base = f"sluice:job:{_job_id(client)}"
        wait_until(lambda: client.xlen(f"{base}:results") >= 4, timeout=20)  # answers wait for the rerun
        server.latency = 0.0
        second = run_cli(server, *args, env=_env(server))
    finally:
        _stop(worker)
    assert second.returncode == 0, second.stderr
    assert _lines(out) == list(range(1, 81))
    assert _duplicates(server) <= 4  # at most what the dead coordinator's own worker had in flight


def test_redis_restarted_mid_job_loses_nothing(server: FakeServer, redis_server: RedisServer, tmp_path: Path) -> None:
    server.latency = 0.05
    source = write_jsonl(tmp_path / "in.jsonl", questions(200))
    out = tmp_path / "out.jsonl"
    log_path = tmp_path / "err.log"
    with log_path.open("w") as log:
        coordinator = start_cli(
            server, *_run_args(source, out, redis_server, "--concurrency", "8"), env=_env(server), stderr=log
        )
        try:
            wait_until(lambda: out.exists() and len(out.read_bytes().splitlines()) >= 40, timeout=30)
            redis_server.stop()
            time.sleep(3.0)
            redis_server.start()
            try:
                coordinator.wait(timeout=60)
            except subprocess.TimeoutExpired:  # say where it stood: this is the hard case to see
                written = len(out.read_bytes().splitlines())
                pytest.fail(
                    f"the job did not end ({written}/200 written)\n{_streams(_client(redis_server))}\n"
                    f"{log_path.read_text()[-4000:]}"
                )
        finally:
            _kill(coordinator)
    err = log_path.read_text()
    assert coordinator.returncode == 0, err
    assert "cannot be reached" in err
    # said once per outage, not "back" and "cannot be reached" again every second meanwhile
    assert err.count("taking work again") <= 1, err
    assert _lines(out) == list(range(1, 201))
    assert _duplicates(server) <= 8


def test_results_whose_read_reply_was_lost_are_read_again(
    server: FakeServer, redis_server: RedisServer, tmp_path: Path
) -> None:
    """A read of results whose reply never arrives (a dropped connection that redis-py's
    silent retry papers over) leaves them pending on the coordinator's consumer: it reads
    them again now and then, so the job still ends with every line."""
    server.latency = 0.05
    source = write_jsonl(tmp_path / "in.jsonl", questions(60))
    out = tmp_path / "out.jsonl"
    log_path = tmp_path / "err.log"
    client = _client(redis_server)
    with log_path.open("w") as log:
        coordinator = start_cli(
            server, *_run_args(source, out, redis_server, "--concurrency", "4"), env=_env(server), stderr=log
        )
        try:
            results = f"sluice:job:{_job_id(client)}:results"
            lost: list[Any] = []

            def lose_a_reply() -> bool:  # read as the coordinator, and drop what came back
                reply: Any = client.xreadgroup("coordinator", "coordinator", {results: ">"}, count=3)
                lost.extend(entry for _, entries in reply or () for entry in entries)
                return bool(lost)

            wait_until(lose_a_reply, timeout=30)
            try:
                coordinator.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pytest.fail(f"the job did not end\n{_streams(client)}\n{log_path.read_text()[-4000:]}")
        finally:
            _kill(coordinator)
    assert coordinator.returncode == 0, log_path.read_text()
    assert _lines(out) == list(range(1, 61))
    assert server.stats.received == 60  # read again, not sent again


def _streams(client: redis.Redis) -> str:
    """Each stream's length and consumer groups (pending counts), for a failure's message."""
    said: list[str] = []
    for name in sorted(client.keys("sluice:*")):
        if client.type(name) == b"stream":
            groups: Any = client.xinfo_groups(name)
            said.append(f"{name.decode()}: length {client.xlen(name)}, groups {groups}")
    return "\n".join(said)


def test_redis_that_lost_its_data_gets_the_job_again_and_it_completes(
    server: FakeServer, redis_server: RedisServer, tmp_path: Path
) -> None:
    """Restarted without persistence, Redis forgets the job: the coordinator registers it
    again and feeds every line not written yet; still one record per line."""
    server.latency = 0.05
    source = write_jsonl(tmp_path / "in.jsonl", questions(200))
    out = tmp_path / "out.jsonl"
    log = (tmp_path / "err.log").open("w")
    coordinator = start_cli(
        server, *_run_args(source, out, redis_server, "--concurrency", "8"), env=_env(server), stderr=log
    )
    try:
        wait_until(lambda: out.exists() and len(out.read_bytes().splitlines()) >= 40, timeout=30)
        redis_server.kill()
        shutil.rmtree(redis_server.directory)
        redis_server.directory.mkdir()
        redis_server.start()
        coordinator.wait(timeout=60)
    finally:
        _kill(coordinator)
        log.close()
    err = (tmp_path / "err.log").read_text()
    assert coordinator.returncode == 0, err
    assert "Redis no longer knows the job" in err
    assert _lines(out) == list(range(1, 201))


def _one_worker_runs(
    server: FakeServer, redis_server: RedisServer, source: Path, out: Path, *extra: str
) -> subprocess.CompletedProcess[str]:
    """The job run by one `sluice worker` (the coordinator only coordinates)."""
    worker = _worker(server, redis_server, "--concurrency", "4", "--name", "w1")
    try:
        client = _client(redis_server)
        wait_until(lambda: client.scard("sluice:workers") == 1, timeout=30)
        args = _run_args(source, out, redis_server, "--no-local-worker", *extra)
        return run_cli(server, *args, env=_env(server))
    finally:
        _stop(worker)


def test_workers_validate_a_schema_and_reask_like_the_coordinator(
    server: FakeServer, redis_server: RedisServer, tmp_path: Path
) -> None:
    """The schema travels with each request (as its JSON Schema), so workers validate and
    re-ask; the records are the same as one process would write."""
    server.structured.configure(first=1, kinds=["missing"])
    schema = {
        "type": "object",
        "properties": {"label": {"type": "string"}, "n": {"type": "integer"}},
        "required": ["label", "n"],
    }
    (tmp_path / "schema.json").write_text(json.dumps(schema))
    source = write_jsonl(tmp_path / "in.jsonl", questions(40))
    out = tmp_path / "out.jsonl"
    run = _one_worker_runs(server, redis_server, source, out, "--schema", str(tmp_path / "schema.json"))
    assert run.returncode == 0, run.stdout + run.stderr
    records = read_output(out)
    assert len(records) == 40
    assert all(r["ok"] and r["reasks"] == 1 and set(r["parsed"]) == {"label", "n"} for r in records)
    assert server.stats.received == 80


def test_an_always_invalid_line_is_final_for_its_delivery_and_billed_in_its_record(
    server: FakeServer, redis_server: RedisServer, tmp_path: Path
) -> None:
    """Its re-asks were made (and billed) by one delivery: it is not delivered again."""
    server.structured.configure(rate=1.0, kinds=["prose"])
    server.prices = {"*": (1.0, 2.0)}
    (tmp_path / "schema.json").write_text(json.dumps({"type": "object", "properties": {"a": {"type": "string"}}}))
    source = write_jsonl(tmp_path / "in.jsonl", questions(6))
    out = tmp_path / "out.jsonl"
    extra = ("--schema", str(tmp_path / "schema.json"), "--max-reasks", "2", "--price", "1,2")
    run = _one_worker_runs(server, redis_server, source, out, *extra)
    assert run.returncode == 1, run.stdout + run.stderr
    records = read_output(out)
    assert {r["error"]["type"] for r in records} == {"invalid_output"}
    assert all(r["reasks"] == 2 and r["attempts"] == 3 for r in records)
    assert server.stats.received == 18
    assert sum(r["cost_usd"] for r in records) == pytest.approx(server.total_billed_usd, rel=1e-9)


def test_workers_send_a_responses_line_as_written(
    server: FakeServer, redis_server: RedisServer, tmp_path: Path
) -> None:
    """The native body travels with each request: a worker sends a /v1/responses line to a
    deployment that speaks Responses as it is, not as its chat translation."""
    lines = [
        {
            "custom_id": f"r{i}",
            "method": "POST",
            "url": "/v1/responses",
            "body": {"model": "openai/gpt-test", "input": f"question {i}", "max_output_tokens": 30},
        }
        for i in range(12)
    ]
    source = write_jsonl(tmp_path / "in.jsonl", lines)
    out = tmp_path / "out.jsonl"
    run = _one_worker_runs(server, redis_server, source, out)
    assert run.returncode == 0, run.stdout + run.stderr
    records = read_output(out)
    assert sorted(r["text"] for r in records) == sorted(f"echo: question {i}" for i in range(12))
    assert server.stats.by_path["/v1/responses"] == 12
    assert server.stats.by_path.get("/v1/chat/completions", 0) == 0
