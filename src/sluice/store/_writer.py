"""One writer thread per state file: group commit, off the event loop.

A commit per result on the event loop stalls every request in flight for its duration
(~70 µs each, most of a batch job's overhead), and a disk that stalls (full, slow, a
network mount) would freeze the whole loop. So writes go to a thread with its own
connection. It takes everything queued since its last commit and commits it as one
transaction: under load one commit covers many results; when idle it commits at once.

A caller that must know its write is durable (an intent before a send, an answer before
it is handed out) awaits it; the thread resolves the futures of a whole batch with one
``call_soon_threadsafe`` per event loop. When a commit fails (disk full, read-only,
locked) the writer is *broken*: that batch and every later write fail with the same
:class:`~sluice.StoreError`, so a job stops on the first failure instead of limping on.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import queue
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._errors import StoreError

__all__ = ["Writer", "describe_sqlite_error"]

Op = Callable[[sqlite3.Connection], Any]
#: Who waits for an op: nobody, a coroutine on an event loop, or a blocked thread.
Waiter = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]"] | concurrent.futures.Future[Any] | None

_STOP = object()
#: Ops per transaction at most: bounds the time a burst holds the write lock.
_MAX_BATCH = 2048


def describe_sqlite_error(exc: BaseException) -> str:
    """SQLite's words and code name ("database or disk is full (SQLITE_FULL)")."""
    name = getattr(exc, "sqlite_errorname", None)
    return f"{exc} ({name})" if name else str(exc)


class Writer:
    """Applies ops to one SQLite file in its own thread, a transaction per batch."""

    def __init__(self, path: Path, setup: Op) -> None:
        self.path = path
        self.error: StoreError | None = None
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._ready: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._run, args=(setup,), name=f"sluice-store {path.name}", daemon=True)
        self._thread.start()
        self._ready.result()  # raises what opening the file raised

    # -- submitting ----------------------------------------------------------------------

    def submit(self, op: Op, waiter: Waiter = None) -> None:
        if self.error is not None or not self._thread.is_alive():
            self.error = self.error or StoreError(f"the state file's writer stopped ({self.path})")
            _resolve_one(waiter, None, self.error)
            return
        self._queue.put((op, waiter))

    async def run(self, op: Op) -> Any:
        """Apply ``op`` and wait until it is committed; its return value."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self.submit(op, (loop, future))
        # No shield (it costs a second future per write): a caller cancelled while waiting
        # cancels only this future; the op still commits, and _resolve_many skips a done one.
        return await future

    def run_sync(self, op: Op) -> Any:
        """Apply ``op`` and block until it is committed (startup and shutdown only)."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self.submit(op, future)
        while True:
            try:
                return future.result(timeout=1.0)
            except concurrent.futures.TimeoutError:
                if not self._thread.is_alive():  # never wait on a writer that is gone
                    raise self.error or StoreError(f"the state file's writer stopped ({self.path})") from None

    def close(self) -> None:
        """Commit what is queued, then stop the thread."""
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join()

    # -- the thread ----------------------------------------------------------------------

    def _run(self, setup: Op) -> None:
        try:
            db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            setup(db)
        except BaseException as exc:
            self._ready.set_exception(exc)
            return
        self._ready.set_result(None)
        try:
            self._loop(db)
        except BaseException as exc:  # the thread must not die with writes waiting on it
            self.error = self.error or StoreError(f"the state file's writer stopped: {type(exc).__name__}: {exc}")
            self._fail_pending()
            raise
        finally:
            db.close()

    def _loop(self, db: sqlite3.Connection) -> None:
        while True:
            batch = [self._queue.get()]
            while len(batch) < _MAX_BATCH:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            ops = [item for item in batch if item is not _STOP]
            if ops:
                self._apply(db, ops)
            if len(ops) != len(batch):
                break

    def _fail_pending(self) -> None:
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is not _STOP:
                _resolve_one(item[1], None, self.error)

    def _apply(self, db: sqlite3.Connection, ops: list[tuple[Op, Waiter]]) -> None:
        values: list[Any] = []
        error = self.error
        if error is None:
            try:
                db.execute("BEGIN IMMEDIATE")
                values = [op(db) for op, _ in ops]
                db.execute("COMMIT")
            except (sqlite3.Error, OSError) as exc:
                with contextlib.suppress(sqlite3.Error):
                    db.execute("ROLLBACK")
                error = self.error = StoreError(
                    f"cannot write the state file {self.path}: {describe_sqlite_error(exc)}"
                )
            except Exception as exc:  # a value SQLite refuses (an int past 64 bits...), or a bug:
                # still a clean stop, never a dead thread with its waiters left hanging
                with contextlib.suppress(sqlite3.Error):
                    db.execute("ROLLBACK")
                error = self.error = StoreError(f"cannot write the state file {self.path}: {type(exc).__name__}: {exc}")
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], Any]]] = {}
        for i, (_, waiter) in enumerate(ops):
            value = values[i] if error is None else None
            if isinstance(waiter, tuple):
                by_loop.setdefault(waiter[0], []).append((waiter[1], value))
            else:
                _resolve_one(waiter, value, error)
        for loop, items in by_loop.items():
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting
                loop.call_soon_threadsafe(_resolve_many, items, error)


def _resolve_many(items: list[tuple[asyncio.Future[Any], Any]], error: StoreError | None) -> None:
    for future, value in items:
        if future.done():
            continue
        if error is None:
            future.set_result(value)
        else:
            future.set_exception(error)


def _resolve_one(waiter: Waiter, value: Any, error: StoreError | None) -> None:
    if waiter is None:
        return
    if isinstance(waiter, tuple):
        loop, future = waiter
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(_resolve_many, [(future, value)], error)
        return
    if error is None:
        waiter.set_result(value)
    else:
        waiter.set_exception(error)
