"""The output file: one JSON record per input record, appended as results land.

The file is the job's ledger of what has been *written*; the store is the ledger of
what has been *answered*. A result is committed to the store first and written here
second, so after a crash a rerun finds every answer in one or the other: lines already
here are skipped, answers only in the store are written from it, and nothing is sent
twice. A half-written last line (the crash came mid-write) is cut off and redone.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from .. import _errors, _json
from .._models import Result
from .._records import error_record, usage_record
from ._inputs import InputItem

__all__ = ["DoneLines", "OutputWriter", "output_record", "prepare_output"]


def _provider_kinds() -> frozenset[str]:
    kinds: set[str] = set()
    pending: list[type[_errors.SluiceError]] = [_errors.ProviderError]
    while pending:
        cls = pending.pop()
        kinds.add(cls.kind)
        pending.extend(cls.__subclasses__())
    return frozenset(kinds)


#: Failures that cost an attempt at the provider: kept on a rerun unless --retry-failed.
#: Any other failure (bad input, cancelled, over budget) is redone on every rerun.
PROVIDER_FAILURES = _provider_kinds()


class DoneLines:
    """A bitmap of record numbers already in the output: 1 bit each, so 1M lines = 125 KB."""

    __slots__ = ("_bits", "count")

    def __init__(self) -> None:
        self._bits = bytearray()
        self.count = 0

    def add(self, line: int) -> None:
        byte, bit = divmod(line, 8)
        if byte >= len(self._bits):
            self._bits.extend(bytes(byte - len(self._bits) + 1024))
        if not self._bits[byte] & (1 << bit):
            self._bits[byte] |= 1 << bit
            self.count += 1

    def __contains__(self, line: int) -> bool:
        byte, bit = divmod(line, 8)
        return byte < len(self._bits) and bool(self._bits[byte] & (1 << bit))


@dataclass(frozen=True, slots=True)
class Prepared:
    done: DoneLines
    kept: int
    dropped: int
    repaired_bytes: int


def _keep(record: Any, retry_failed: bool) -> int | None:
    """The record's line number if it stays in the output on this run, else None."""
    if not isinstance(record, dict) or not isinstance(record.get("line"), int):
        return None
    if record.get("ok") is True:
        return int(record["line"])
    error = record.get("error")
    kind = error.get("type") if isinstance(error, dict) else None
    if kind in PROVIDER_FAILURES and not retry_failed:
        return int(record["line"])
    return None


def prepare_output(path: Path, *, retry_failed: bool) -> Prepared:
    """Repair a torn last line, drop records this run must redo, and list what is done."""
    done = DoneLines()
    if not path.exists():
        return Prepared(done, 0, 0, 0)
    repaired = _cut_torn_tail(path)
    dropped = 0
    with path.open("rb") as f:
        for raw in f:
            try:
                line = _keep(_json.loads(raw), retry_failed)
            except ValueError:
                line = None
            if line is None or line in done:
                dropped += 1
                continue
            done.add(line)
    if dropped:
        _rewrite_without_dropped(path, retry_failed)
    return Prepared(done, done.count, dropped, repaired)


def _cut_torn_tail(path: Path) -> int:
    """Truncate after the last newline; returns how many bytes were cut."""
    size = path.stat().st_size
    if size == 0:
        return 0
    with path.open("rb+") as f:
        position = size
        while position > 0:
            step = min(65536, position)
            f.seek(position - step)
            chunk = f.read(step)
            newline = chunk.rfind(b"\n")
            if newline != -1:
                end = position - step + newline + 1
                if end != size:
                    f.truncate(end)
                return size - end
            position -= step
        f.truncate(0)
        return size


def _rewrite_without_dropped(path: Path, retry_failed: bool) -> None:
    """Atomically replace the output with only the records kept on this run."""
    temporary = path.with_name(path.name + ".rewrite")
    seen = DoneLines()
    with path.open("rb") as source, temporary.open("wb") as target:
        for raw in source:
            try:
                line = _keep(_json.loads(raw), retry_failed)
            except ValueError:
                continue
            if line is not None and line not in seen:
                seen.add(line)
                target.write(raw)
        target.flush()
        os.fsync(target.fileno())
    os.replace(temporary, path)


def output_record(item: InputItem, result: Result) -> dict[str, Any]:
    """The JSON record of one input record's outcome (``line`` first, for cheap scans)."""
    record: dict[str, Any] = {"line": item.line, "id": item.custom_id or _id(item, result)}
    if item.custom_id is not None:
        record["custom_id"] = item.custom_id
    record["ok"] = result.ok
    record["text"] = result.text
    record["response"] = result.raw
    record["error"] = error_record(result.error) if result.error is not None else None
    record["usage"] = usage_record(result.usage)
    record["cost_usd"] = result.cost_usd
    record["attempts"] = result.attempts
    record["latency_s"] = round(result.timings.latency, 4)
    record["deployment"] = result.deployment
    record["cached"] = result.cached
    record["metadata"] = dict(result.metadata)
    return record


def _id(item: InputItem, result: Result) -> str:
    return result.id if result.request is not None else f"line-{item.line}"


class OutputWriter:
    """Appends records; buffered (the store, not this file, is what must survive a crash)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] = path.open("a", encoding="utf-8", buffering=1 << 16)
        self.written = 0

    def write(self, record: dict[str, Any]) -> None:
        self._file.write(_json.dumps_text(record) + "\n")
        self.written += 1

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        if not self._file.closed:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
