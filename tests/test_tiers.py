"""Service tiers through the ``sluice`` command: ``--tier batch`` over the fake's Files +
Batches API (its own clock of batch progress and its own ledger), crashes at each step of
the submission protocol, and ``--tier flex``."""

from __future__ import annotations

import contextlib
import math
import os
import signal
import sqlite3
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from clitools import MODEL, env_for, questions, read_output, run_cli, start_cli, wait_until, write_jsonl

from sluice.testing import FakeServer

PRICE = (1.0, 2.0)  # USD per Mtok in, out: the fake's and sluice's (--price) agree
BATCH = ("--tier", "batch", "--poll-every", "0.2", "--price", "1,2")


@pytest.fixture
def fake_prices() -> dict[str, tuple[float, float]]:
    return {"*": PRICE}


def _job(tmp_path: Path, n: int) -> tuple[Path, Path]:
    return write_jsonl(tmp_path / "in.jsonl", questions(n)), tmp_path / "out.jsonl"


def _check_answered_once(server: FakeServer, out: Path, n: int) -> list[dict[str, Any]]:
    """Every line answered once, by a batch, and nothing sent synchronously or billed twice."""
    records = read_output(out)
    assert sorted(r["line"] for r in records) == list(range(1, n + 1))
    assert all(r["ok"] for r in records), [r["error"] for r in records if not r["ok"]][:3]
    assert {r["tier"] for r in records} == {"batch"}
    assert all(r["batch_id"] in server.batches.batches for r in records)
    assert server.stats.received == 0  # no synchronous request
    assert server.stats.accepted == n
    assert server.stats.duplicate_successes == 0
    assert {e.tier for e in server.ledger} == {"batch"}
    return records


def _chunks(state: Path) -> list[tuple[int, str | None, str]]:
    with contextlib.closing(sqlite3.connect(state)) as db:
        try:
            return list(db.execute("SELECT id, batch_id, status FROM tier_chunks ORDER BY id"))
        except sqlite3.OperationalError:  # not created yet
            return []


def _kill_once_its_batch_is_recorded(server: FakeServer, src: Path, out: Path) -> None:
    """Start the batch job and ``kill -9`` it as soon as its batch's id is in the state."""
    state = out.with_suffix(".sluice.db")
    job = start_cli(server, "run", src, "-o", out, "--model", MODEL, *BATCH)
    try:
        wait_until(lambda: any(batch_id for _, batch_id, _ in _chunks(state)), timeout=30)
    finally:
        job.kill()
        job.communicate()


def test_a_batch_job_answers_every_line_once_at_the_batch_price(server: FakeServer, tmp_path: Path) -> None:
    src, out = _job(tmp_path, 50)
    done = run_cli(server, "run", src, "-o", out, "--model", MODEL, *BATCH, "--batch-size", "20")
    assert done.returncode == 0, done.stderr
    records = _check_answered_once(server, out, 50)
    sizes = [len(b.lines) for b in server.batches.batches.values()]
    assert sum(sizes) == 50
    assert max(sizes) == 20
    billed = server.total_billed_usd
    full_price = sum((e.input_tokens * PRICE[0] + e.output_tokens * PRICE[1]) / 1e6 for e in server.ledger)
    assert billed == pytest.approx(full_price / 2)
    assert sum(r["cost_usd"] for r in records) == pytest.approx(billed, rel=1e-6)  # what sluice says it cost


def test_a_budget_of_twice_the_batch_bill_pays_for_the_job(server: FakeServer, tmp_path: Path) -> None:
    """Each line reserves its worst case at the batch price before it joins a chunk."""
    src, out = _job(tmp_path, 40)
    first = run_cli(server, "run", src, "-o", out, "--model", MODEL, *BATCH)
    assert first.returncode == 0, first.stderr
    billed = server.total_billed_usd
    server.reset_stats()
    again = tmp_path / "again.jsonl"
    budget = f"{2 * billed:.9f}"
    done = run_cli(server, "run", src, "-o", again, "--model", MODEL, *BATCH, "--budget", budget, "--no-cache")
    assert done.returncode == 0, done.stdout + done.stderr
    _check_answered_once(server, again, 40)
    assert server.total_billed_usd <= 2 * billed


def test_kill_9_while_the_batch_runs_then_the_rerun_collects_it(server: FakeServer, tmp_path: Path) -> None:
    """The batch keeps running at the provider; the rerun follows it instead of sending again."""
    server.batches.start_after = 1.5
    src, out = _job(tmp_path, 60)
    _kill_once_its_batch_is_recorded(server, src, out)
    assert server.stats.accepted == 0  # killed before the batch answered anything
    # ~2x what the batch bills (60 lines of 10 + 16 tokens at half of $1/$2 per Mtok: $0.00126);
    # had the killed run's lines been counted at their worst case too, it would not pay
    budget = "0.0026"
    done = run_cli(server, "run", src, "-o", out, "--model", MODEL, *BATCH, "--budget", budget)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "60 lines of the last run were waiting in provider batches" in done.stderr
    records = _check_answered_once(server, out, 60)
    assert len(server.batches.batches) == 1
    assert server.total_billed_usd * 2 <= 0.0026
    assert sum(r["cost_usd"] for r in records) == pytest.approx(server.total_billed_usd, rel=1e-6)


def test_a_crash_between_creating_the_batch_and_recording_it_submits_nothing_twice(
    server: FakeServer, tmp_path: Path
) -> None:
    """The provider made the batch, the client died before its id was journalled: the
    rerun finds it by the job's and chunk's tags."""
    src, out = _job(tmp_path, 30)
    job = start_cli(server, "run", src, "-o", out, "--model", MODEL, *BATCH)
    killed: list[Mapping[str, Any]] = []

    def kill_the_client(batch: Mapping[str, Any]) -> None:
        os.kill(job.pid, signal.SIGKILL)  # before the reply leaves the server
        killed.append(batch)

    server.batches.on_created = kill_the_client
    try:
        job.communicate(timeout=60)
    finally:
        server.batches.on_created = None
    assert job.returncode == -signal.SIGKILL
    assert killed
    assert [batch_id for _, batch_id, _ in _chunks(out.with_suffix(".sluice.db"))] == [None]
    done = run_cli(server, "run", src, "-o", out, "--model", MODEL, *BATCH)
    assert done.returncode == 0, done.stderr
    _check_answered_once(server, out, 30)
    assert list(server.batches.batches) == [killed[0]["id"]]


def test_lines_a_batch_failed_on_the_providers_side_are_submitted_again(server: FakeServer, tmp_path: Path) -> None:
    server.batches.fail_lines(3, status=500)
    src, out = _job(tmp_path, 30)
    done = run_cli(server, "run", src, "-o", out, "--model", MODEL, *BATCH)
    assert done.returncode == 0, done.stderr
    records = _check_answered_once(server, out, 30)
    assert sorted(r["attempts"] for r in records)[-3:] == [2, 2, 2]
    assert len(server.batches.batches) == 2


def test_an_expired_batch_keeps_its_finished_lines_and_the_rest_go_again(server: FakeServer, tmp_path: Path) -> None:
    server.batches.lines_per_second = 40
    server.batches.expire_after = 0.6
    src, out = _job(tmp_path, 40)
    done = run_cli(server, "run", src, "-o", out, "--model", MODEL, *BATCH)
    assert done.returncode == 0, done.stderr
    _check_answered_once(server, out, 40)
    statuses = [b.status for b in server.batches.batches.values()]
    assert statuses.count("expired") >= 1
    assert statuses[-1] == "completed"


def test_a_batch_refused_for_the_enqueued_token_limit_waits_and_goes_again(server: FakeServer, tmp_path: Path) -> None:
    server.batches.start_after = 0.5
    server.batches.enqueued_token_limit = 400  # one batch of 10 lines (~28 tokens each) at a time
    src, out = _job(tmp_path, 30)
    done = run_cli(server, "run", src, "-o", out, "--model", MODEL, *BATCH, "--batch-size", "10")
    assert done.returncode == 0, done.stderr
    _check_answered_once(server, out, 30)
    failed = [b for b in server.batches.batches.values() if b.status == "failed"]
    assert failed
    assert all(e["code"] == "token_limit_exceeded" for b in failed for e in b.errors or [])


def test_batch_flags_are_checked_before_anything_runs(server: FakeServer, tmp_path: Path) -> None:
    src, out = _job(tmp_path, 3)
    wrong = run_cli(server, "run", src, "-o", out, "--model", MODEL, "--poll-every", "1")
    assert wrong.returncode == 2
    assert "--poll-every applies to --tier batch or auto only" in wrong.stderr
    too_big = run_cli(server, "run", src, "-o", out, "--model", MODEL, "--tier", "batch", "--batch-size", "60000")
    assert too_big.returncode == 2
    assert "--batch-size" in too_big.stderr
    assert not out.exists()
    simulated = run_cli(server, "run", src, "-o", out, "--model", "simulate/demo", "--tier", "batch")
    assert simulated.returncode == 2
    assert "has no Batch API" in simulated.stderr
    assert not out.exists()
    assert not out.with_suffix(".sluice.db").exists()


def test_flex_requests_are_half_price_and_a_capacity_refusal_is_retried(server: FakeServer, tmp_path: Path) -> None:
    server.refuse_flex(2)
    src, out = _job(tmp_path, 10)
    done = run_cli(server, "run", src, "-o", out, "--model", MODEL, "--tier", "flex", "--price", "1,2")
    assert done.returncode == 0, done.stderr
    records = read_output(out)
    assert all(r["ok"] and r["tier"] == "flex" for r in records)
    assert server.stats.rate_limited == 2
    assert {e.tier for e in server.ledger} == {"flex"}
    assert sum(r["cost_usd"] for r in records) == pytest.approx(server.total_billed_usd, rel=1e-6)


def test_a_flex_capacity_refusal_is_retried_without_pausing_the_deployment(server: FakeServer, tmp_path: Path) -> None:
    """A flex 429 "resource unavailable" is about capacity for that request, not the key's
    rate: the request is tried again after its own backoff, the other requests go on at
    the deployment's pace (no cooldown in the state's timeline), and none is billed twice."""
    server.flex_refusal_rate = 0.1
    n = 100
    src, out = _job(tmp_path, n)
    args = ("--tier", "flex", "--price", "1,2", "--rpm", "1200")
    done = run_cli(server, "run", src, "-o", out, "--model", MODEL, *args, timeout=100)
    assert done.returncode == 0, done.stderr
    records = read_output(out)
    assert len(records) == n
    assert all(r["ok"] and r["tier"] == "flex" for r in records)
    refused = server.stats.rate_limited_by["flex"]
    assert refused > 0
    assert sum(r["attempts"] for r in records) == n + refused  # each refusal tried again, by its request
    with contextlib.closing(sqlite3.connect(out.with_suffix(".sluice.db"))) as db:
        pauses = db.execute("SELECT why FROM timeline_cooldowns").fetchall()
    assert pauses == []  # the deployment never paused
    assert server.stats.duplicate_successes == 0
    assert "0 x 429" in done.stdout  # not counted as the key's rate limits


async def test_the_fakes_batches_are_visible_only_to_their_key() -> None:
    """The fake as OpenAI documents it: upload, create, list, retrieve, results; another
    key sees none of it."""
    async with FakeServer(api_key=None) as fake, aiohttp.ClientSession() as http:
        mine = {"Authorization": "Bearer sk-one"}
        theirs = {"Authorization": "Bearer sk-two"}
        form = aiohttp.FormData()
        form.add_field("purpose", "batch")
        line = b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": '
        line += b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}}\n'
        form.add_field("file", line, filename="in.jsonl")
        async with http.post(f"{fake.url}/files", data=form, headers=mine) as response:
            file_id = (await response.json())["id"]
        body = {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"}
        async with http.post(f"{fake.url}/batches", json=body, headers=theirs) as response:
            assert response.status == 400  # not their file
        body["metadata"] = {"job": "x"}
        async with http.post(f"{fake.url}/batches", json=body, headers=mine) as response:
            batch = await response.json()
        assert batch["status"] == "validating"
        assert batch["metadata"] == {"job": "x"}
        await fake.until(lambda: fake.batches.status_of(batch["id"]) == "completed", timeout=5)
        async with http.get(f"{fake.url}/batches/{batch['id']}", headers=theirs) as response:
            assert response.status == 404
        async with http.get(f"{fake.url}/batches", headers=theirs) as response:
            assert (await response.json())["data"] == []
        async with http.get(f"{fake.url}/batches/{batch['id']}", headers=mine) as response:
            done = await response.json()
        assert done["request_counts"] == {"total": 1, "completed": 1, "failed": 0}
        async with http.get(f"{fake.url}/files/{done['output_file_id']}/content", headers=mine) as response:
            (result,) = (await response.read()).splitlines()
        assert b'"custom_id":"a"' in result
        assert b'"status_code":200' in result


ANTHROPIC = "anthropic/claude-test"


def _anthropic_env(server: FakeServer) -> dict[str, str]:
    return env_for(server, ANTHROPIC_BASE_URL=server.anthropic_url, ANTHROPIC_API_KEY="sk-test")


def test_an_anthropic_job_runs_through_message_batches(server: FakeServer, tmp_path: Path) -> None:
    src, out = _job(tmp_path, 1000)
    done = run_cli(
        server, "run", src, "-o", out, "--model", ANTHROPIC, *BATCH, "--batch-size", "400", env=_anthropic_env(server)
    )
    assert done.returncode == 0, done.stderr
    records = _check_answered_once(server, out, 1000)
    assert all(b.anthropic for b in server.batches.batches.values())
    assert max(len(b.lines) for b in server.batches.batches.values()) == 400
    assert records[0]["text"].startswith("echo: question")
    assert sum(r["cost_usd"] for r in records) == pytest.approx(server.total_billed_usd, rel=1e-6)


def test_an_unrecorded_anthropic_batch_is_found_by_what_can_be_seen_of_it(server: FakeServer, tmp_path: Path) -> None:
    """Anthropic's batches carry no tags: the rerun takes the one batch created after the
    chunk was journalled, still running, with as many requests."""
    server.batches.start_after = 3600.0  # still running when the rerun looks, however slow it starts
    src, out = _job(tmp_path, 30)
    env = _anthropic_env(server)
    job = start_cli(server, "run", src, "-o", out, "--model", ANTHROPIC, *BATCH, env=env)
    server.batches.on_created = lambda batch: os.kill(job.pid, signal.SIGKILL)
    try:
        job.communicate(timeout=60)
    finally:
        server.batches.on_created = None
    assert job.returncode == -signal.SIGKILL

    def once_it_follows_one(call: str) -> None:  # the rerun asks for a batch by id: it adopted one
        if call.startswith("GET /v1/messages/batches/"):
            server.batches.start_after = 0.0

    server.batches.on_request = once_it_follows_one
    done = run_cli(server, "run", src, "-o", out, "--model", ANTHROPIC, *BATCH, env=env)
    assert done.returncode == 0, done.stderr
    _check_answered_once(server, out, 30)
    assert len(server.batches.batches) == 1


AUTO = ("--tier", "auto", "--poll-every", "0.2", "--price", "1,2", "--rpm", "1200")


def test_auto_keeps_to_the_batch_while_it_can_finish_in_time(server: FakeServer, tmp_path: Path) -> None:
    src, out = _job(tmp_path, 40)
    done = run_cli(server, "run", src, "-o", out, "--model", MODEL, *AUTO, "--deadline", "1h")
    assert done.returncode == 0, done.stderr
    _check_answered_once(server, out, 40)


#: Batches of the default size (every line waits in memory) and of 20 lines (200 lines park).
SIZES = pytest.mark.parametrize("size", [(), ("--batch-size", "20")], ids=["in-memory", "parked"])


@SIZES
def test_auto_meets_the_deadline_synchronously_when_the_batch_never_starts(
    server: FakeServer, tmp_path: Path, size: tuple[str, ...]
) -> None:
    """200 lines at 20 a second take 10 s synchronously: with 20 s to go the plan waits
    for the batch a few seconds, then cancels it and sends the rest itself."""
    server.batches.start_after = math.inf
    src, out = _job(tmp_path, 200)
    started = time.monotonic()
    args = ("--deadline", "20s", *size)
    done = run_cli(server, "run", src, "-o", out, "--model", MODEL, *AUTO, *args, timeout=120)
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    records = read_output(out)
    assert len(records) == 200
    assert all(r["ok"] for r in records)
    assert {r["tier"] for r in records} == {"sync"}
    assert took < 20 + 8  # the deadline, plus the process's start and a few seconds
    assert server.batches.open_batches == []  # nothing left running at the provider
    assert {b.status for b in server.batches.batches.values()} == {"cancelled"}
    assert "answered twice" not in done.stdout  # the batch answered none of them
    assert server.stats.accepted == 200
    assert server.stats.duplicate_successes == 0


def test_auto_needs_a_deadline(server: FakeServer, tmp_path: Path) -> None:
    src, out = _job(tmp_path, 3)
    done = run_cli(server, "run", src, "-o", out, "--model", MODEL, "--tier", "auto")
    assert done.returncode == 2
    assert "--deadline" in done.stderr
    bad = run_cli(server, "run", src, "-o", out, "--model", MODEL, *AUTO, "--deadline", "soon")
    assert bad.returncode == 2
    assert "not a duration" in bad.stderr


def test_sluice_cancel_cancels_the_jobs_batches_and_the_rerun_sends_the_rest(
    server: FakeServer, tmp_path: Path
) -> None:
    server.batches.start_after = math.inf
    src, out = _job(tmp_path, 20)
    state = out.with_suffix(".sluice.db")
    job = start_cli(server, "run", src, "-o", out, "--model", MODEL, *BATCH, "--grace", "0")
    try:
        wait_until(lambda: any(batch_id for _, batch_id, _ in _chunks(state)), timeout=30)
        busy = run_cli(server, "cancel", out)
        assert busy.returncode == 2  # refused while the job runs: it would send the lines again
        assert "in use by a running sluice job" in busy.stderr
        job.send_signal(signal.SIGINT)
        stdout, stderr = job.communicate(timeout=30)
    finally:
        job.kill()
    assert job.returncode == 130, stderr
    assert "still running at the provider: rerun the same command to collect them" in stdout
    (first,) = server.batches.batches
    cancelled = run_cli(server, "cancel", out)
    assert cancelled.returncode == 0, cancelled.stderr
    assert f"{first}  cancelling" in cancelled.stdout  # as OpenAI answers a cancel
    wait_until(lambda: server.batches.status_of(first) == "cancelled")
    assert server.batches.open_batches == []
    server.batches.start_after = 0.0
    done = run_cli(server, "run", src, "-o", out, "--model", MODEL, *BATCH)
    assert done.returncode == 0, done.stderr
    _check_answered_once(server, out, 20)
    again = run_cli(server, "cancel", out)
    assert again.returncode == 0
    assert "no provider batch of this job is open" in again.stdout


@pytest.mark.parametrize(
    ("step", "prefix"),
    [
        ("upload", "POST /v1/files"),
        ("poll", "GET /v1/batches/"),
        ("download", "GET /v1/files/file-"),
    ],
)
def test_kill_9_at_each_step_then_every_line_is_answered_once(
    server: FakeServer, tmp_path: Path, step: str, prefix: str
) -> None:
    """The client dies as its request for that step reaches the provider; the rerun ends
    with every line answered once, no line billed twice, nothing sent synchronously."""
    src, out = _job(tmp_path, 25)
    job = start_cli(server, "run", src, "-o", out, "--model", MODEL, *BATCH)
    seen: list[str] = []

    def kill_at(what: str) -> None:
        if what.startswith(prefix) and not seen and (step != "download" or what.endswith("/content")):
            seen.append(what)
            os.kill(job.pid, signal.SIGKILL)

    server.batches.on_request = kill_at
    try:
        job.communicate(timeout=60)
    finally:
        server.batches.on_request = None
    assert job.returncode == -signal.SIGKILL
    assert seen
    done = run_cli(server, "run", src, "-o", out, "--model", MODEL, *BATCH)
    assert done.returncode == 0, done.stderr
    _check_answered_once(server, out, 25)
    assert len(server.batches.batches) == 1


@SIZES
def test_auto_answers_a_line_from_its_cancelled_batch_rather_than_twice(
    server: FakeServer, tmp_path: Path, size: tuple[str, ...]
) -> None:
    """A slow batch answers some lines before the deadline's cancel lands: those lines'
    answers are the batch's (billed once, at the batch price); only the rest go
    synchronously. The records' costs are the fake's bill, and nothing is answered twice."""
    server.batches.lines_per_second = 20 if not size else 2  # 20 a second in all, however many batches
    src, out = _job(tmp_path, 200)
    args = ("--deadline", "20s", *size)
    done = run_cli(server, "run", src, "-o", out, "--model", MODEL, *AUTO, *args, timeout=120)
    assert done.returncode == 0, done.stderr
    records = read_output(out)
    assert sorted(r["line"] for r in records) == list(range(1, 201))
    assert all(r["ok"] for r in records)
    by_tier = {tier: sum(1 for r in records if r["tier"] == tier) for tier in ("batch", "sync")}
    billed = {tier: sum(1 for e in server.ledger if e.tier == tier) for tier in ("batch", "sync")}
    assert by_tier["batch"] > 0  # the batch did answer some before it was cancelled
    assert by_tier == billed  # each line's record is the one answer the fake billed for it
    assert server.stats.duplicate_successes == 0
    assert sum(r["cost_usd"] for r in records) == pytest.approx(server.total_billed_usd, rel=1e-9, abs=1e-12)
    assert "answered twice" not in done.stdout
    assert server.batches.open_batches == []


def test_a_failed_result_download_is_read_again_not_billed_twice(server: FakeServer, tmp_path: Path) -> None:
    """The batch answered (and was billed for) every line: a 500 while reading its output
    file must not send them out again."""
    server.batches.fail_calls("GET /v1/files/", times=2)
    src, out = _job(tmp_path, 25)
    done = run_cli(server, "run", src, "-o", out, "--model", MODEL, *BATCH)
    assert done.returncode == 0, done.stderr
    _check_answered_once(server, out, 25)
    assert len(server.batches.batches) == 1


def test_a_create_whose_reply_is_lost_is_found_not_made_twice(server: FakeServer, tmp_path: Path) -> None:
    server.batches.fail_calls("POST /v1/batches", status=500)  # nothing made
    server.batches.fail_calls("POST /v1/batches", status=502, after=True)  # made; the reply lost
    src, out = _job(tmp_path, 10)
    done = run_cli(server, "run", src, "-o", out, "--model", MODEL, *BATCH, timeout=90)
    assert done.returncode == 0, done.stderr
    _check_answered_once(server, out, 10)
    assert len(server.batches.batches) == 1


def test_a_killed_batch_job_is_not_rerun_synchronously(server: FakeServer, tmp_path: Path) -> None:
    """Its lines wait in a provider batch: a sync rerun would send them again. Refused with
    what to do; an auto rerun collects them (the same keys in every tier)."""
    server.batches.start_after = 1.0
    src, out = _job(tmp_path, 10)
    _kill_once_its_batch_is_recorded(server, src, out)
    sync = run_cli(server, "run", src, "-o", out, "--model", MODEL)
    assert sync.returncode == 2
    assert "10 lines of this job wait in provider batches" in sync.stderr
    assert "sluice cancel" in sync.stderr
    assert server.stats.received == 0
    auto = run_cli(server, "run", src, "-o", out, "--model", MODEL, *AUTO, "--deadline", "1h")
    assert auto.returncode == 0, auto.stderr
    _check_answered_once(server, out, 10)
    assert len(server.batches.batches) == 1


def test_a_named_deployment_keeps_its_name_in_the_batch_tier(server: FakeServer, tmp_path: Path) -> None:
    """Lines that name a configured deployment (``name = "big"``) reach its Batch API, and
    records name it as configured."""
    config = tmp_path / "sluice.toml"
    config.write_text(
        f'[[deployment]]\nmodel = "{MODEL}"\nname = "big"\nbase_url = "{server.url}"\n'
        'api_key_env = "OPENAI_API_KEY"\nprice = { input_per_mtok = 1.0, output_per_mtok = 2.0 }\n'
    )
    src, out = _job(tmp_path, 5)
    done = run_cli(server, "run", src, "-o", out, "--config", config, "--model", "big", *BATCH)
    assert done.returncode == 0, done.stderr
    records = _check_answered_once(server, out, 5)
    assert {r["deployment"] for r in records} == {"big"}


def test_a_rerun_with_a_wrong_key_gives_up_no_batch(server: FakeServer, tmp_path: Path) -> None:
    """A 401 while looking at the recorded batch is the key's fault, not the batch's: it
    stays recorded, and the rerun with the right key collects it (nothing sent twice)."""
    server.batches.start_after = 1.5
    src, out = _job(tmp_path, 10)
    state = out.with_suffix(".sluice.db")
    _kill_once_its_batch_is_recorded(server, src, out)
    wrong = run_cli(
        server, "run", src, "-o", out, "--model", MODEL, *BATCH, env=env_for(server, OPENAI_API_KEY="sk-no")
    )
    assert wrong.returncode != 0
    assert [status for _, _, status in _chunks(state)] == ["submitted"]
    done = run_cli(server, "run", src, "-o", out, "--model", MODEL, *BATCH)
    assert done.returncode == 0, done.stderr
    _check_answered_once(server, out, 10)
    assert len(server.batches.batches) == 1
