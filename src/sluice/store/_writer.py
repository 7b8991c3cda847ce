"""One writer thread per state file: group commit, off the event loop.

A commit per result on the event loop stalls every request in flight for its duration
(~70 µs each, most of a batch job's overhead), and a disk that stalls (full, slow, a
network mount) would freeze the whole loop. So writes go to a thread with its own
connection. It takes everything queued since its last commit and commits it as one
transaction: under load one commit covers many results; when idle it commits at once.

Writes submitted from an event loop are handed to the thread once per loop iteration, as
one batch: at a thousand results a second the thread then wakes (and commits) once per
tick instead of once per write, and the loop does not lose the core to it for every
write on a machine with few cores. A caller that must know its write is durable (an
intent before a send, an answer before it is handed out) awaits it; the thread resolves
the futures of a whole batch with one ``call_soon_threadsafe`` per event loop. When a
commit fails (disk full, read-only, locked) the writer is *broken*: that batch and every later write fail with the same
:class:`~sluice.StoreError`, so a job stops on the first failure instead of limping on.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import os
import queue
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._errors import StoreError

__all__ = ["Writer", "describe_sqlite_error", "disk_full"]

Op = Callable[[sqlite3.Connection], Any]
#: Who waits for an op: nobody, a coroutine on an event loop, or a blocked thread.
Waiter = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]"] | concurrent.futures.Future[Any] | None

_STOP = object()
#: Ops per transaction, about (a loop iteration's batch is not split): bounds the time a
#: burst holds the write lock.
_MAX_BATCH = 2048


def disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` says the disk is full (ENOSPC, a quota, SQLite's SQLITE_FULL)."""
    if isinstance(exc, OSError):
        return exc.errno in (errno.ENOSPC, errno.EDQUOT)
    return getattr(exc, "sqlite_errorname", None) == "SQLITE_FULL"


def describe_sqlite_error(exc: BaseException) -> str:
    """SQLite's words and code name ("database or disk is full (SQLITE_FULL)")."""
    name = getattr(exc, "sqlite_errorname", None)
    return f"{exc} ({name})" if name else str(exc)


class Writer:
    """Applies ops to one SQLite file in its own thread, a transaction per batch."""

    def __init__(self, path: Path, setup: Op, on_full: Callable[[], bool] | None = None) -> None:
        self.path = path
        self.error: StoreError | None = None
        #: Asked (in the thread) when a commit finds the disk full: True when it made room,
        #: and the batch is tried once more.
        self._on_full = on_full
        #: Items: a list of (op, waiter) to apply in order, or _STOP.
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        #: Ops submitted on an event loop this iteration, handed over at its end.
        self._pending: list[tuple[Op, Waiter]] = []
        self._pending_loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        self._ready: concurrent.futures.Future[None] = concurrent.futures.Future()
        #: The thread stopped (or is stopping) and takes nothing more: a flag, not
        #: ``Thread.is_alive()``, which takes a lock on every write.
        self._stopped = False
        self._thread = threading.Thread(target=self._run, args=(setup,), name=f"sluice-store {path.name}", daemon=True)
        self._thread.start()
        self._ready.result()  # raises what opening the file raised

    # -- submitting ----------------------------------------------------------------------

    def submit(self, op: Op, waiter: Waiter = None) -> None:
        if self.error is not None or self._stopped:
            self.error = self.error or StoreError(f"the state file's writer stopped ({self.path})")
            _resolve_one(waiter, None, self.error)
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop in this thread: straight to the writer, after what is pending
            self._hand_over()
            self._queue.put([(op, waiter)])
            return
        with self._lock:
            pending = self._pending
            if pending and self._pending_loop is loop:
                pending.append((op, waiter))
                return
        self._hand_over()  # another loop's batch (rare): keep the order
        with self._lock:
            self._pending.append((op, waiter))
            self._pending_loop = loop
        loop.call_soon(self._hand_over)

    def _hand_over(self) -> None:
        """This iteration's writes go to the thread as one batch."""
        with self._lock:
            batch, self._pending, self._pending_loop = self._pending, [], None
        if not batch:
            return
        if self.error is not None or self._stopped:
            error = self.error or StoreError(f"the state file's writer stopped ({self.path})")
            for _, waiter in batch:
                _resolve_one(waiter, None, error)
            return
        self._queue.put(batch)

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
        if self.error is not None or not self._thread.is_alive():
            self.submit(op, future)  # fails it
        else:
            self._hand_over()  # after what this loop queued before it
            self._queue.put([(op, future)])
        while True:
            try:
                return future.result(timeout=1.0)
            except concurrent.futures.TimeoutError:
                if not self._thread.is_alive():  # never wait on a writer that is gone
                    raise self.error or StoreError(f"the state file's writer stopped ({self.path})") from None

    def close(self) -> None:
        """Commit what is queued, then stop the thread."""
        if self._thread.is_alive():
            self._hand_over()
            self._stopped = True  # nothing is taken after the stop
            self._queue.put(_STOP)
            self._thread.join()

    # -- the thread ----------------------------------------------------------------------

    def _run(self, setup: Op) -> None:
        try:
            _yield_to_the_loop()
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
            self._stopped = True
            db.close()

    def _loop(self, db: sqlite3.Connection) -> None:
        stop = False
        while not stop:
            item = self._queue.get()
            ops: list[tuple[Op, Waiter]] = []
            while True:
                if item is _STOP:
                    stop = True
                    break
                ops += item
                if len(ops) >= _MAX_BATCH:
                    break
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
            if ops:
                self._apply(db, ops)

    def _commit(self, db: sqlite3.Connection, ops: list[tuple[Op, Waiter]]) -> list[Any]:
        """The ops in one transaction, tried once more when the disk was full and
        ``on_full`` made room."""
        try:
            return _transaction(db, ops)
        except (sqlite3.Error, OSError) as exc:
            if not (disk_full(exc) and self._on_full is not None and self._on_full()):
                raise
        return _transaction(db, ops)

    def _fail_pending(self) -> None:
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is not _STOP:
                for _, waiter in item:
                    _resolve_one(waiter, None, self.error)

    def _apply(self, db: sqlite3.Connection, ops: list[tuple[Op, Waiter]]) -> None:
        values: list[Any] = []
        error = self.error
        if error is None:
            try:
                values = self._commit(db, ops)
            except (sqlite3.Error, OSError) as exc:
                error = self.error = StoreError(
                    f"cannot write the state file {self.path}: {describe_sqlite_error(exc)}"
                )
            except Exception as exc:  # a value SQLite refuses (an int past 64 bits...), or a bug:
                # still a clean stop (rolled back), never a dead thread with its waiters left hanging
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


def _transaction(db: sqlite3.Connection, ops: list[tuple[Op, Waiter]]) -> list[Any]:
    """Apply the ops and commit; rolled back if anything fails."""
    try:
        db.execute("BEGIN IMMEDIATE")
        values = [op(db) for op, _ in ops]
        db.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            db.execute("ROLLBACK")
        raise
    return values


def _yield_to_the_loop() -> None:
    """Mark the calling thread (the writer) SCHED_BATCH, where the OS has it (Linux).

    Woken by a hand-over while the event loop still has work, a normal thread preempts
    the loop at once, commits the few ops handed over so far, and hands the core back:
    on a busy core that was a context switch every few results (~55,000 per 100,000
    results, a sixth of a batch job's CPU). A batch thread is not scheduled in on waking,
    only when the loop waits or its time slice ends, so each commit takes all that
    queued meanwhile. It still gets its fair share of the CPU, and a loop that waits for
    an intent's commit yields to it at once; where the writer has a core of its own this
    changes nothing."""
    set_policy = getattr(os, "sched_setscheduler", None)
    batch = getattr(os, "SCHED_BATCH", None)
    if set_policy is not None and batch is not None:
        with contextlib.suppress(OSError):  # not allowed (a sandbox): the default is fine
            set_policy(0, batch, os.sched_param(0))  # 0: this thread, not the process


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
