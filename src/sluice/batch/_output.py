"""The output file: one JSON record per input record, appended as results land.

The file is the job's ledger of what has been *written*; the store is the ledger of
what has been *answered*. A result is committed to the store first and written here
second, so after a crash a rerun finds every answer in one or the other: lines already
here are skipped, answers only in the store are written from it, and nothing is sent
twice. A half-written last line (the crash came mid-write) is cut off and redone.

Each record carries ``request_hash``, a hash of the request its line made: a rerun over
an input edited in place redoes the lines whose request changed instead of keeping
answers to questions nobody asks any more.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import os
import tempfile
from array import array
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import _errors, _json
from .._errors import ConfigError
from .._models import BATCH_SUFFIX, Request, Result, store_key
from .._records import error_record, usage_record, usd_record
from ..store._writer import disk_full
from ._inputs import InputItem

if TYPE_CHECKING:
    from ._job import JobProgress
    from ._room import DiskRoom

__all__ = [
    "KEPT_KINDS",
    "DoneLines",
    "JobOutput",
    "OutputFile",
    "OutputWriter",
    "Prepared",
    "looks_like_output",
    "output_record",
    "prepare_output",
    "request_hash",
]


def _kept_kinds() -> frozenset[str]:
    kinds: set[str] = set()
    pending: list[type[_errors.SluiceError]] = [_errors.SluiceError]
    while pending:
        cls = pending.pop()
        if cls.kept_on_rerun:
            kinds.add(cls.kind)
        pending.extend(cls.__subclasses__())
    return frozenset(kinds)


#: Failures a rerun keeps unless --retry-failed: the provider rejected the request itself.
#: Every other failure (keys, connections, the server, money, time, bad input) is redone.
KEPT_KINDS = _kept_kinds()


def request_hash(request: Request) -> str:
    """16 hex digits naming what a line asks (its id and content): a changed line differs."""
    return hashlib.blake2b(store_key(request).encode(), digest_size=8).hexdigest()


class DoneLines:
    """Record numbers already in the output, with each one's request hash.

    A bitmap (1 bit per line) and an array of 64-bit hashes (0: unknown): 1M lines take
    ~8 MB, where a dict of them would take ten times that.
    """

    __slots__ = ("_bits", "_hashes", "count")

    def __init__(self) -> None:
        self._bits = bytearray()
        self._hashes = array("Q")
        self.count = 0

    def add(self, line: int, digest: int = 0) -> None:
        byte, bit = divmod(line, 8)
        if byte >= len(self._bits):
            self._bits.extend(bytes(byte - len(self._bits) + 1024))
        if not self._bits[byte] & (1 << bit):
            self._bits[byte] |= 1 << bit
            self.count += 1
        if digest:
            if line >= len(self._hashes):
                self._hashes.extend([0] * (line - len(self._hashes) + 1024))
            self._hashes[line] = digest

    def discard(self, line: int) -> None:
        byte, bit = divmod(line, 8)
        if byte < len(self._bits) and self._bits[byte] & (1 << bit):
            self._bits[byte] &= ~(1 << bit) & 0xFF
            self.count -= 1

    def digest(self, line: int) -> int:
        return self._hashes[line] if line < len(self._hashes) else 0

    @property
    def has_digests(self) -> bool:
        return any(self._hashes)

    def __contains__(self, line: int) -> bool:
        byte, bit = divmod(line, 8)
        return byte < len(self._bits) and bool(self._bits[byte] & (1 << bit))


@dataclass(frozen=True, slots=True)
class Prepared:
    done: DoneLines
    kept: int
    dropped: int
    repaired_bytes: int
    #: Of ``kept``, failures kept from earlier runs (the request's own fault).
    kept_failures: int = 0
    #: Lines whose input changed since their record was written: dropped and redone.
    changed: int = 0
    #: Dollars the records in the file say they cost (all of them, kept or not).
    cost_usd: float = 0.0


def _keep(record: Any, retry_failed: bool, total: int | None = None) -> int | None:
    """The record's line number if it stays in the output on this run, else None."""
    if not isinstance(record, dict) or not isinstance(record.get("line"), int):
        return None
    if not 1 <= record["line"] <= (total if total is not None else record["line"]):
        return None
    if record.get("ok") is True:
        return int(record["line"])
    error = record.get("error")
    kind = error.get("type") if isinstance(error, dict) else None
    if kind in KEPT_KINDS and not retry_failed:
        return int(record["line"])
    return None


def _digest(record: dict[str, Any]) -> int:
    value = record.get("request_hash")
    try:
        return int(value, 16) if isinstance(value, str) else 0
    except ValueError:
        return 0


def looks_like_output(path: Path) -> bool:
    """Whether ``path`` starts like a sluice output (a JSON record with ``line`` and ``ok``)."""
    try:
        with path.open("rb") as f:
            first = f.readline(1 << 20)
        record = _json.loads(first)
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and isinstance(record.get("line"), int) and "ok" in record


def prepare_output(
    output: OutputFile,
    *,
    retry_failed: bool,
    total: int | None = None,
    line_hashes: Callable[[], Iterable[tuple[int, str]]] | None = None,
) -> Prepared:
    """Repair a torn last line, drop records this run must redo, and list what is done.

    ``line_hashes`` gives the current input's ``(line, request_hash)``; a record whose line
    now asks something else is dropped and redone. A record for a line the input does not
    have (past ``total``) is dropped: it cannot be this input's.
    """
    done = DoneLines()
    repaired = output.cut_torn_tail()
    dropped = kept_failures = 0
    cost = 0.0
    for raw in output.lines():
        try:
            record = _json.loads(raw)
        except ValueError:
            record = None
        line = _keep(record, retry_failed, total)
        if isinstance(record, dict) and isinstance(record.get("cost_usd"), (int, float)):
            cost += max(0.0, float(record["cost_usd"]))
        if line is None or line in done:
            dropped += 1
            continue
        assert isinstance(record, dict)
        done.add(line, _digest(record))
        if record.get("ok") is not True:
            kept_failures += 1
    changed: set[int] = set()
    if line_hashes is not None and done.has_digests:
        for line, digest in line_hashes():
            known = done.digest(line)
            if line in done and known and known != int(digest, 16):
                changed.add(line)
                done.discard(line)
    if dropped or changed:
        kept = DoneLines()

        def keep(raw: bytes) -> bool:
            try:
                line = _keep(_json.loads(raw), retry_failed, total)
            except ValueError:
                return False
            if line is None or line in kept or line in changed:
                return False
            kept.add(line)
            return True

        output.rewrite(keep)
    return Prepared(done, done.count, dropped + len(changed), repaired, kept_failures, len(changed), cost)


def output_record(item: InputItem, result: Result, sent: Request | None = None) -> dict[str, Any]:
    """The JSON record of one input record's outcome (``line`` first, for cheap scans).

    ``sent`` is the request as the line made it (before the engine adapted it): its hash
    goes into the record, and a ``max_tokens`` the engine had to add (a budgeted run
    caps every request) is named, so a cut answer is never silently cut.
    """
    record: dict[str, Any] = {"line": item.line, "id": item.custom_id or _id(item, result)}
    if item.custom_id is not None:
        record["custom_id"] = item.custom_id
    record["ok"] = result.ok
    record["text"] = result.text
    record["response"] = result.raw
    record["error"] = error_record(result.error) if result.error is not None else None
    record["finish_reason"] = result.finish_reason
    record["usage"] = usage_record(result.usage)
    record["cost_usd"] = usd_record(result.cost_usd)
    record["attempts"] = result.attempts
    record["latency_s"] = round(result.timings.latency, 4)
    record["deployment"] = result.deployment
    record["model"] = result.model.removesuffix(BATCH_SUFFIX) if result.model else None  # auto's batch tier
    record["tier"] = result.tier
    if result.batch_id is not None:
        record["batch_id"] = result.batch_id
    schema = result.request.schema if result.request is not None else None
    if schema is not None:  # structured: the validated answer, and what it took
        record["parsed"] = schema.to_json(result.parsed)
        record["reasks"] = result.reasks
        record["reask_cost_usd"] = usd_record(result.reask_cost_usd)
    record["cached"] = result.cached
    if sent is not None:
        record["request_hash"] = request_hash(sent)
        added = max_tokens_added(sent, result)
        if added is not None:
            record["max_tokens_added"] = added
    record["metadata"] = dict(result.metadata)
    return record


def max_tokens_added(sent: Request, result: Result) -> int | None:
    """The output cap the engine set on a request that gave none (a budget needs one)."""
    if result.request is None or sent.max_tokens is not None:
        return None
    if any(isinstance(sent.params.get(k), int) for k in ("max_tokens", "max_completion_tokens")):
        return None
    return result.request.max_tokens


def _id(item: InputItem, result: Result) -> str:
    return result.id if result.request is not None else f"line-{item.line}"


class OutputFile:
    """The job's output, opened once and locked for the whole run.

    The lock (flock) is on this open file, so everything that touches the output — cutting
    a torn line, dropping records to redo, starting over, appending — happens in place on
    the same file while the lock is held: a second job writing the same output (say with
    another ``--state``) is refused whatever flags it has, and no temporary name next to
    the output exists for a symlink to redirect.

    Records are appended with one ``write`` per batch (a job hands over each event-loop
    tick's records together), and a batch that cannot be written whole is cut off again:
    the file holds whole records only, and the caller knows exactly which ones. A record
    is only handed over once its answer is in the state file, which is what a rerun
    trusts: a kill -9 between the two loses nothing.
    """

    def __init__(self, path: Path, room: DiskRoom | None = None) -> None:
        self.path = path
        #: The job's watch on its disks: a write that finds the disk full frees the room
        #: kept there, and is tried once more.
        self.room = room
        self.existed = path.exists()
        try:
            self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise ConfigError(f"cannot open the output {path}: {exc.strerror}") from None
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._fd)
            raise ConfigError(f"{path} is being written by another sluice job; wait for it or stop it") from None
        self.written = 0

    @property
    def size(self) -> int:
        return os.fstat(self._fd).st_size

    def lines(self) -> Iterator[bytes]:
        """The records now in the file (read through the locked file itself)."""
        with os.fdopen(os.dup(self._fd), "rb") as f:
            f.seek(0)
            yield from f

    def cut_torn_tail(self) -> int:
        """Truncate after the last newline; returns how many bytes were cut."""
        size = self.size
        if size == 0:
            return 0
        position = size
        while position > 0:
            step = min(65536, position)
            chunk = os.pread(self._fd, step, position - step)
            newline = chunk.rfind(b"\n")
            if newline != -1:
                end = position - step + newline + 1
                if end != size:
                    self._truncate(end)
                return size - end
            position -= step
        self._truncate(0)
        return size

    def rewrite(self, keep: Callable[[bytes], bool]) -> None:
        """Keep only the records ``keep`` accepts. Copied aside to an anonymous temporary file,
        then written back in place: a crash in between loses only records the state file
        still holds (a rerun writes them again from there, sending nothing)."""
        with tempfile.TemporaryFile(dir=self.path.parent) as aside:
            for raw in self.lines():
                if keep(raw):
                    aside.write(raw)
            aside.flush()
            aside.seek(0)
            self._truncate(0)
            while chunk := aside.read(1 << 20):
                self._write_all(chunk)
        os.fsync(self._fd)

    def start_over(self) -> None:
        """Empty the file (``--restart``, ``--overwrite``)."""
        self._truncate(0)

    def write(self, record: dict[str, Any]) -> None:
        self.write_lines([_json.dumps_line(record)])

    def write_lines(self, lines: list[bytes]) -> None:
        """Append encoded records (each ending in a newline) in one write, all or none:
        on OSError (disk full...) the file is cut back to where it was, then it raises."""
        start = self.size
        data = lines[0] if len(lines) == 1 else b"".join(lines)
        try:
            try:
                self._write_all(data)
            except OSError as exc:
                if not (disk_full(exc) and self.room is not None and self.room.release(self.path)):
                    raise
                self._truncate(start)
                self._write_all(data)
        except OSError:
            with contextlib.suppress(OSError):
                self._truncate(start)
            raise
        self.written += len(lines)

    def close(self) -> None:
        """Sync and close (the lock goes with it); raises OSError if the sync fails."""
        if self._fd < 0:
            return
        try:
            os.fsync(self._fd)
        finally:
            os.close(self._fd)
            self._fd = -1

    def discard(self) -> None:
        """Close without a trace: remove the file if this run created it and it is empty."""
        created_empty = not self.existed and self._fd >= 0 and self.size == 0
        self.close()
        if created_empty:
            with contextlib.suppress(OSError):
                self.path.unlink()

    def _truncate(self, size: int) -> None:
        os.ftruncate(self._fd, size)

    def _write_all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]


#: The name the writers of a job's records use for the open output.
OutputWriter = OutputFile


class JobOutput:
    """The output writer, with a failure (disk full...) turned into a clean stop.

    :meth:`write_soon` gathers the records of one event-loop tick into one ``write``: a
    fast job lands a dozen answers a tick, and a write (with the file-system journal it
    touches) per record was a large part of a job's own cost."""

    def __init__(self, writer: OutputFile, progress: JobProgress) -> None:
        self._writer = writer
        self._progress = progress
        self._lines: list[bytes] = []
        self._then: list[Callable[[], None]] = []
        self._unwritten: list[Callable[[], None] | None] = []

    @property
    def path(self) -> Path:
        return self._writer.path

    @property
    def room(self) -> DiskRoom | None:
        return self._writer.room

    def write(self, record: dict[str, object]) -> bool:
        """Write one record now; False (and the job stops) when the file cannot take it."""
        self.flush()  # after what was queued before it
        return self._write([_json.dumps_line(record)])

    def write_now(self, lines: list[bytes]) -> bool:
        """Write encoded records now, after what is queued, in one write; False (and the
        job stops) when the file cannot take them (the caller counts where they are kept)."""
        self.flush()
        return self._write(lines, count=False)

    def write_soon(
        self, record: dict[str, object], then: Callable[[], None], unwritten: Callable[[], None] | None = None
    ) -> None:
        """Queue a record for this tick's write; ``then`` runs once it is in the file. If the
        file cannot take it the job stops, and ``unwritten`` runs instead: it counts where
        the answer is kept (without it, the answer is counted as in the state)."""
        if self._progress.output_error is not None:
            self._not_written([unwritten])
            return
        if not self._lines:
            asyncio.get_running_loop().call_soon(self.flush)
        self._lines.append(_json.dumps_line(record))
        self._then.append(then)
        self._unwritten.append(unwritten)

    def flush(self) -> None:
        """Write what is queued."""
        lines, then, unwritten = self._lines, self._then, self._unwritten
        if not lines:
            return
        self._lines, self._then, self._unwritten = [], [], []
        if self._write(lines, count=False):
            for written in then:
                written()
        else:
            self._not_written(unwritten)

    def _not_written(self, unwritten: list[Callable[[], None] | None]) -> None:
        for each in unwritten:
            if each is None:
                self._progress.not_written += 1
            else:
                each()

    def close(self) -> None:
        self.flush()
        try:
            self._writer.close()
        except OSError as exc:
            self._failed(exc)

    def _write(self, lines: list[bytes], *, count: bool = True) -> bool:
        if self._progress.output_error is None:
            try:
                self._writer.write_lines(lines)
                return True
            except OSError as exc:
                self._failed(exc)
        if count:
            self._progress.not_written += len(lines)
        return False

    def _failed(self, exc: OSError) -> None:
        if self._progress.output_error is None:
            self._progress.output_error = f"cannot write the output {self._writer.path}: {exc.strerror or exc}"
            self._progress.stop()
