"""The SQLite store under the engine: resume, cache, identical requests sent once."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from clitools import MODEL, env_for, questions, read_output, write_jsonl
from fake_provider import deployment_at

import sluice
from sluice import BadRequestError, Deployment, Engine, Price, Request, Result, RetryPolicy, SluiceError
from sluice.store import SqliteStore
from sluice.testing import FakeServer


def _requests(n: int) -> list[Request]:
    return [Request.from_prompt("openai/gpt-test", f"question {i}") for i in range(n)]


async def test_a_second_run_is_served_from_the_store(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    async with FakeServer(api_key="sk-test") as server:
        store = SqliteStore(path)
        async with Engine(deployment_at(server), store=store) as engine:
            first = await engine.run(_requests(20))
        store.close()
        assert server.stats.received == 20

        store = SqliteStore(path)  # a new process would open the same file
        async with Engine(deployment_at(server), store=store) as engine:
            second = await engine.run(_requests(25))
        store.close()
    assert server.stats.received == 25  # only the 5 new ones were sent
    assert [r.text for r in second[:20]] == [r.text for r in first]
    assert all(r.cached for r in second[:20])
    assert not any(r.cached for r in second[20:])
    assert engine.stats.cached == 20
    assert server.stats.duplicate_successes == 0


async def test_stored_failures_are_reused_unless_retry_failed(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.db")
    policy = RetryPolicy(max_attempts=1)
    async with FakeServer(api_key="sk-test") as server:
        server.inject("400", times=1)
        async with Engine(deployment_at(server), store=store, retry=policy) as engine:
            (failed,) = await engine.run(_requests(1))
        assert isinstance(failed.error, BadRequestError)
        async with Engine(deployment_at(server), store=store, retry=policy) as engine:
            (again,) = await engine.run(_requests(1))
        assert isinstance(again.error, BadRequestError)
        assert again.cached
        assert str(again.error) == str(failed.error)
        assert again.error.status == 400
        assert server.stats.received == 1
        async with Engine(deployment_at(server), store=store, retry_failed=True) as engine:
            (retried,) = await engine.run(_requests(1))
        assert retried.ok
        assert server.stats.received == 2
    assert store.summary()["succeeded"] == 1
    store.close()


async def test_identical_requests_in_flight_are_sent_once(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.db")
    async with FakeServer(api_key="sk-test", latency=0.05) as server:
        same = [Request.from_prompt("openai/gpt-test", "same question") for _ in range(5)]
        async with Engine(deployment_at(server), store=store) as engine:
            results = await engine.run(same)
        assert server.stats.received == 1
    assert [r.ok for r in results] == [True] * 5
    assert sum(r.cached for r in results) == 4
    assert [r.index for r in results] == [0, 1, 2, 3, 4]
    store.close()


async def test_a_given_id_is_part_of_the_key(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.db")
    async with FakeServer(api_key="sk-test") as server:
        twins = [Request.from_prompt("openai/gpt-test", "same", id=f"row-{i}") for i in range(3)]
        async with Engine(deployment_at(server), store=store) as engine:
            await engine.run(twins)
        assert server.stats.received == 3  # three rows the user told apart
    store.close()


def test_summary_and_meta(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.db")
    store.set_meta(input="in.jsonl", total=3)
    assert store.meta() == {"input": "in.jsonl", "total": 3, "schema": 3}
    assert store.summary()["results"] == 0
    store.close()
    readonly = SqliteStore(tmp_path / "state.db", readonly=True)
    assert readonly.meta()["total"] == 3
    readonly.close()


def test_a_file_that_is_not_a_store_is_refused(tmp_path: Path) -> None:
    import pytest

    from sluice import ConfigError

    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(ConfigError, match="not a usable sluice state file"):
        SqliteStore(junk)


async def test_every_attempt_of_one_request_carries_the_same_idempotency_key(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.db")
    async with FakeServer(api_key="sk-test") as server:
        server.inject("500", times=2)
        policy = RetryPolicy(max_attempts=5, base_delay=0.01)
        async with Engine(deployment_at(server), store=store, retry=policy) as engine:
            (result,) = await engine.run(_requests(1))
        assert result.attempts == 3
        ((key, count),) = server.stats.by_key.items()
        assert key.startswith("sluice-")
        assert count == 3
    store.close()


@pytest.mark.parametrize("expected", [None, 100, 20_000])
def test_the_fresh_state_filter_never_forgets_a_key_it_was_given(expected: int | None) -> None:
    """A first run skips the lookup for keys it never stored: no stored key may be missed,
    however wrong the job's guess of how many there will be."""
    from sluice.store._key_filter import KeyFilter

    keys = [f"row-{i}\x1f{i:032x}" for i in range(20_000)]
    seen = KeyFilter(expected)
    assert not any(seen.add(key) for key in keys[:50])  # new keys are new (a few may collide later)
    for key in keys:
        seen.add(key)
    assert all(seen.may_hold(key) for key in keys)
    assert all(seen.add(key) for key in keys[:1000])  # a key put again is "maybe"
    strangers = sum(seen.may_hold(f"other-{i}") for i in range(100_000))
    if expected != 100:  # sized for what came: a false "maybe" is rare (then the query decides)
        assert strangers <= 2
    else:  # 200 times the keys it was sized for: "maybe" half the time, still never a miss
        assert strangers > 20_000


def test_the_fresh_state_filter_is_sized_for_the_job_within_bounds(tmp_path: Path) -> None:
    from sluice.store._key_filter import KeyFilter

    assert KeyFilter(10).size_bytes == 8 * 1024  # a small job does not take 16 MB
    assert KeyFilter(1_000_000).size_bytes == 8 * 1024 * 1024  # 64 bits a key, rounded up to a power of two
    assert KeyFilter(10**9).size_bytes == 64 * 1024 * 1024  # capped: peak RSS stays bounded
    assert KeyFilter().size_bytes == 16 * 1024 * 1024
    store = SqliteStore(tmp_path / "state.db", exclusive=True, expected_keys=300)
    try:
        assert store._fresh is not None
        assert store._fresh.size_bytes == 8 * 1024
    finally:
        store.close()


async def test_a_first_run_serves_an_identical_request_that_landed_earlier(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.db")
    async with FakeServer(api_key="sk-test") as server:
        async with Engine(deployment_at(server), store=store) as engine:
            first = await engine.complete(Request.from_prompt("openai/gpt-test", "same"))
            again = await engine.complete(Request.from_prompt("openai/gpt-test", "same"))
        assert first.ok
        assert again.cached
        assert server.stats.received == 1
    store.close()


#: results as state files made it before the key index was built apart (a PRIMARY KEY).
_OLDER_RESULTS = (
    "CREATE TABLE results (key TEXT PRIMARY KEY, ok INTEGER NOT NULL, error_type TEXT,"
    " input_tokens INTEGER NOT NULL DEFAULT 0, output_tokens INTEGER NOT NULL DEFAULT 0, cost_usd REAL,"
    " attempts INTEGER NOT NULL DEFAULT 0, latency_s REAL NOT NULL DEFAULT 0, record TEXT NOT NULL,"
    " finished_at REAL NOT NULL);"
)


def _key_indexes(path: Path) -> set[str]:
    """The indexes on results, read through a connection of its own."""
    import sqlite3

    with contextlib.closing(sqlite3.connect(path)) as db:
        return {
            name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type='index' AND tbl_name='results'")
        }


def _rows(path: Path) -> list[str]:
    import sqlite3

    with contextlib.closing(sqlite3.connect(path)) as db:
        return [key for (key,) in db.execute("SELECT key FROM results ORDER BY rowid")]


async def test_a_first_run_appends_without_the_key_index_and_builds_it_when_it_closes(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    store = SqliteStore(path, exclusive=True)
    async with FakeServer(api_key="sk-test") as server:
        async with Engine(deployment_at(server), store=store) as engine:
            await engine.run(_requests(30))
        assert _key_indexes(path) == set()  # appended: no index page per result
        store.close()
        assert _key_indexes(path) == {"results_key"}
        store = SqliteStore(path, exclusive=True)  # not empty: looked up through the index
        async with Engine(deployment_at(server), store=store) as engine:
            again = await engine.run(_requests(30))
        store.close()
    assert all(r.cached for r in again)
    assert server.stats.received == 30
    assert len(_rows(path)) == 30


async def test_a_key_put_twice_in_a_first_run_builds_the_index_and_keeps_one_row(tmp_path: Path) -> None:
    """A duplicate line (or a failure retried) in a first run: the filter is unsure of the
    key, so the index is built there and then, and the second put replaces the first."""
    path = tmp_path / "state.db"
    store = SqliteStore(path, exclusive=True)
    policy = RetryPolicy(max_attempts=1)
    async with FakeServer(api_key="sk-test") as server:
        server.inject("500", times=1)
        async with Engine(deployment_at(server), store=store, retry=policy) as engine:
            (failed,) = await engine.run(_requests(1))  # a failure a rerun redoes
            await engine.run(_requests(3)[1:])
            assert _key_indexes(path) == set()
            (retried,) = await engine.run(_requests(1))  # the same key again
            assert _key_indexes(path) == {"results_key"}
        store.close()
    assert not failed.ok
    assert retried.ok
    keys = _rows(path)
    assert len(keys) == len(set(keys)) == 3
    reopened = SqliteStore(path, readonly=True)
    assert reopened.summary()["succeeded"] == 3
    reopened.close()


def test_a_first_run_killed_before_it_closed_gets_its_index_on_the_next_open(tmp_path: Path) -> None:
    """kill -9 mid-run: the results are there, unindexed; the next open indexes them before
    anything is looked up, and finds every one."""
    path = tmp_path / "state.db"
    script = f"""
import asyncio, os
from sluice import Result, Request
from sluice.store import SqliteStore
store = SqliteStore({str(path)!r}, exclusive=True)
async def main():
    for i in range(50):
        request = Request.from_prompt("openai/gpt-test", f"question {{i}}")
        await store.put(f"key-{{i}}", Result(request, text=f"answer {{i}}"))
asyncio.run(main())
os.kill(os.getpid(), 9)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == -9, done.stderr
    assert _key_indexes(path) == set()
    assert len(_rows(path)) == 50
    store = SqliteStore(path, exclusive=True)
    assert _key_indexes(path) == {"results_key"}
    found = [store.get(f"key-{i}") for i in range(50)]
    store.close()
    assert all(stored is not None and stored.record["text"] == f"answer {i}" for i, stored in enumerate(found))


async def test_a_state_from_before_the_index_change_keeps_its_primary_key(tmp_path: Path) -> None:
    """A state file whose results still have their PRIMARY KEY: opened empty by a job, it
    stays indexed (SQLite's own index), and a key put twice is still one row."""
    import sqlite3

    path = tmp_path / "state.db"
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.executescript(_OLDER_RESULTS + "CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);")
    store = SqliteStore(path, exclusive=True)
    request = Request.from_prompt("openai/gpt-test", "q")
    await store.put("k", Result(request, text="one"))
    await store.put("k", Result(request, text="two"))
    stored = store.get("k")
    store.close()
    assert stored is not None
    assert stored.record["text"] == "two"
    assert _key_indexes(path) == {"sqlite_autoindex_results_1"}
    assert _rows(path) == ["k"]


async def test_charges_add_up_in_a_new_state_and_in_one_with_a_row_per_key(tmp_path: Path) -> None:
    """New files append a row per charge; an older file's charges (one row per key) keep
    being added to; either way the spend is the sum, and a crash's in-flight intents count."""
    import sqlite3

    older = tmp_path / "older.db"
    with contextlib.closing(sqlite3.connect(older)) as db:
        db.executescript(
            "CREATE TABLE charges (key TEXT PRIMARY KEY, answered_usd REAL NOT NULL DEFAULT 0,"
            " maybe_billed_usd REAL NOT NULL DEFAULT 0);"
            "CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);"
            "INSERT INTO meta VALUES ('schema', '2');" + _OLDER_RESULTS
        )
    request = Request.from_prompt("openai/gpt-test", "q")
    for path, rows in ((tmp_path / "new.db", 3), (older, 1)):
        store = SqliteStore(path)
        first = await store.begin("k", 0.5)
        await store.put_settled("k", Result(request, text="a"), first, 0.25, answered=True)
        second = await store.begin("k", 0.5)
        store.settle(second, 0.5, answered=False)  # a timeout it may have been billed for
        await store.begin("k", 0.5)  # in flight when the process died
        store.close()
        store = SqliteStore(path)
        assert store.recover_intents().requests == 1
        spend = store.spend()
        store.close()
        assert (spend.answered, spend.maybe_billed) == (0.25, 1.0), path
        with contextlib.closing(sqlite3.connect(path)) as db:
            assert db.execute("SELECT count(*) FROM charges").fetchone()[0] == rows, path


# -- identical requests, one file shared by two stores ------------------------------------


async def test_identical_requests_waiting_at_the_gate_are_not_sent_twice(tmp_path: Path) -> None:
    async with FakeServer(api_key="sk-test") as server:
        store = SqliteStore(tmp_path / "s.db")
        async with Engine(deployment_at(server), store=store, concurrency=1) as engine:
            results = await engine.run(["same"] * 3, model="openai/gpt-test")
        store.close()
    assert all(r.ok for r in results)
    assert server.stats.received == 1


async def test_a_cancelled_leader_does_not_make_every_follower_send(tmp_path: Path) -> None:
    async with FakeServer(api_key="sk-test", latency=0.3) as server:
        store = SqliteStore(tmp_path / "s.db")
        async with Engine(deployment_at(server), store=store) as engine:
            leader = asyncio.create_task(engine.complete("openai/gpt-test", "same"))
            await server.until(lambda: server.in_flight == 1)
            followers = [asyncio.create_task(engine.complete("openai/gpt-test", "same")) for _ in range(5)]
            await asyncio.sleep(0.05)
            leader.cancel()
            results = await asyncio.gather(*followers)
        store.close()
    assert all(r.ok for r in results)
    assert server.stats.received == 2  # the cancelled leader's, and one follower's


async def test_two_stores_on_one_file_find_each_others_answers(tmp_path: Path) -> None:
    path = tmp_path / "cache.db"
    async with FakeServer(api_key="sk-test") as server:
        deployment = Deployment(MODEL, base_url=server.url, api_key="sk-test", price=Price(1, 1))
        first, second = SqliteStore(path), SqliteStore(path)
        async with Engine(deployment, store=first) as a, Engine(deployment, store=second) as b:
            await a.complete(MODEL, "the same question", max_tokens=10)
            again = await b.complete(MODEL, "the same question", max_tokens=10)
        first.close()
        second.close()
    assert again.cached
    assert server.stats.received == 1


async def test_a_request_whose_messages_grow_is_a_new_request() -> None:
    async with FakeServer(api_key="sk-test") as server:
        store_path = Path(__import__("tempfile").mkdtemp()) / "s.db"
        store = SqliteStore(store_path)
        async with Engine(Deployment(MODEL, base_url=server.url, api_key="sk-test"), store=store) as engine:
            request = Request(MODEL, [{"role": "user", "content": "first question"}], max_tokens=10)
            one = await engine.complete(request)
            request.messages.append({"role": "assistant", "content": one.text})  # type: ignore[attr-defined]
            request.messages.append({"role": "user", "content": "a follow-up"})  # type: ignore[attr-defined]
            two = await engine.complete(request)
        store.close()
    assert not two.cached
    assert two.text == "echo: a follow-up"
    assert server.stats.received == 2


# -- files that are not a usable state, writes that fail --------------------------------


def test_a_store_writer_that_meets_an_unexpected_error_fails_its_waiters_cleanly(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.db")

    def bad(db: sqlite3.Connection) -> None:
        raise OverflowError("Python int too large to convert to SQLite INTEGER")

    with pytest.raises(sluice.StoreError, match="OverflowError"):
        store._write().run_sync(bad)
    with pytest.raises(sluice.StoreError):  # broken for good: no silent partial writes after
        store.set_meta(after=1)
    store.close()


def test_a_foreign_database_is_never_changed(tmp_path: Path) -> None:
    app = tmp_path / "app.db"
    db = sqlite3.connect(app)
    db.execute("CREATE TABLE users (name TEXT)")
    db.execute("CREATE TABLE meta (k TEXT)")
    db.commit()
    db.close()
    before = app.read_bytes()
    with pytest.raises(sluice.ConfigError, match="not a sluice state file"):
        SqliteStore(app)
    assert app.read_bytes() == before


def test_damaged_notes_in_the_state_are_a_clear_error(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.db")
    store.set_meta(input="x")
    store.close()
    db = sqlite3.connect(tmp_path / "state.db")
    db.execute("UPDATE meta SET value = '{not json' WHERE name = 'input'")
    db.commit()
    db.close()
    store = SqliteStore(tmp_path / "state.db", readonly=True)
    with pytest.raises(sluice.ConfigError, match="damaged"):
        store.meta()
    store.close()


def test_a_lookup_after_a_failed_write_still_reads_the_answers_in_the_file(tmp_path: Path) -> None:
    """A first run (exclusive, unindexed): the state's disk fills (EFBIG here, ENOSPC
    alike) and the writer stops. ``get()`` of an answer that IS committed used to be a
    plain read; now it first tries to build the key index through the broken writer and
    raises StoreError. The engine does not expect get() to raise (``_from_store`` has no
    handler): the exception ends ``map()``, cancelling everything in flight."""
    path = tmp_path / "state.db"
    script = textwrap.dedent(
        f"""
        import asyncio, os, resource, signal
        from sluice import Request, Result
        from sluice._errors import StoreError
        from sluice.store import SqliteStore
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        path = {str(path)!r}
        store = SqliteStore(path, exclusive=True)
        request = Request.from_prompt("openai/gpt-test", "q")
        async def main():
            await store.put("k", Result(request, text="the answer"))  # committed
            limit = max(os.path.getsize(path), os.path.getsize(path + "-wal")) + 1024
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
            try:
                await store.put("big", Result(request, text="x" * 2_000_000))
            except StoreError:
                print("write refused")
        asyncio.run(main())
        try:
            stored = store.get("k")
            print("got", stored.record["text"] if stored else None)
        except StoreError as exc:
            print("get raised", exc.message)
        """
    )
    done = subprocess.run([sys.executable, "-B", "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "write refused"
    assert lines[1] == "got the answer", lines[1]


#: Runs ``sluice`` with the key-index build failing as on a full disk (SQLITE_FULL): the
#: only injected fault; everything else is the real command.
_INDEX_BUILD_FAILS = textwrap.dedent(
    """
    import sqlite3, sys
    from sluice.store import _sqlite
    real = _sqlite._key_index_op
    def failing(*, keep):
        op = real(keep=keep)
        def wrapped(db):
            if keep and db.execute("SELECT count(*) FROM results").fetchone()[0]:
                raise sqlite3.OperationalError("database or disk is full")
            return op(db)
        return wrapped
    _sqlite._key_index_op = failing
    sys.argv = ["sluice", *sys.argv[1:]]
    from sluice._entry import main
    main()
    """
)


def test_a_key_index_build_that_fails_mid_run_stops_the_job_cleanly(tmp_path: Path) -> None:
    """A first run meets a line identical to one answered long before (or a Bloom false
    positive): ``get()`` builds the key index there and then. When that build fails (the
    disk is full: an index is the largest single write a run makes), the job must stop as
    it does when a put fails (exit 3, the summary, "rerun the same command"), not abort
    with exit 2 and no summary."""
    with FakeServer(api_key="sk-test").running_in_thread() as server:
        server.latency = 0.01
        records = questions(40)
        records.append(records[0])  # line 41 = line 1, answered long before
        records += questions(20, start=100)
        source = write_jsonl(tmp_path / "in.jsonl", records)
        output = tmp_path / "out.jsonl"
        args = ["run", str(source), "-o", str(output), "--model", MODEL, "--concurrency", "1"]
        done = subprocess.run(
            [sys.executable, "-c", _INDEX_BUILD_FAILS, *args],
            env=env_for(server),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert len(read_output(output)) >= 40
    assert "Traceback" not in done.stderr
    assert done.returncode == 3, done.stderr
    assert "stopped: cannot write the state file" in done.stderr
    assert "rerun the same command" in done.stderr


def _store_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("sluice-store") and t.is_alive()]


def test_an_open_that_fails_building_the_key_index_leaves_no_writer_thread(tmp_path: Path) -> None:
    """Opening a state a crashed first run left without its key index builds the index.
    When that write fails (here: another connection holds the write lock past the busy
    timeout) the StoreError leaves ``__init__`` without closing the writer it started:
    a thread and an open connection leak per failed open (serve opens stores per batch)."""
    path = tmp_path / "state.db"
    SqliteStore(path).close()
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as db:
        db.execute("DROP INDEX results_key")  # as a crashed first run leaves it: the open must build it
    before = len(_store_threads())
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as other:
        other.execute("BEGIN IMMEDIATE")  # holds the write lock
        with pytest.raises(SluiceError):
            SqliteStore(path)
        other.execute("ROLLBACK")
    assert len(_store_threads()) == before


def test_a_state_from_a_newer_sluice_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    """A later layout this version does not know (its charges or results kept another way)
    must not be resumed with this one's statements: the open says so and writes nothing."""
    from sluice._errors import ConfigError

    path = tmp_path / "state.db"
    SqliteStore(path).close()
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as db:
        db.execute("UPDATE meta SET value = '99' WHERE name = 'schema'")
    before = path.read_bytes()
    with pytest.raises(ConfigError, match=r"written by a newer sluice \(state schema 99"):
        SqliteStore(path)
    assert path.read_bytes() == before
    assert not _store_threads()
