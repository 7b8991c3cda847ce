"""Review of the state-file work (unindexed first runs, batched output): failures found."""

from __future__ import annotations

import contextlib
import sqlite3
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from clitools import MODEL, env_for, questions, read_output, write_jsonl

from sluice._errors import SluiceError
from sluice.store import SqliteStore
from sluice.testing import FakeServer


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
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
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
