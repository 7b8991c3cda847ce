"""Room on the disk for the answers a job has sent for.

An answer arrives after it is paid for. When neither the state nor the output can take it
(a full disk fails both), it is lost, and the rerun pays for it again. So:

* a job stops admitting while its disks still have room for every request it may have in
  flight: the file systems of the state and the output are checked at the start and on
  every tick, against what the job has used there per answer so far (at least
  :data:`PER_ANSWER`: the state writes whole pages), times the requests that may be in
  flight and those answered since the last check, plus :data:`MARGIN` for the job's own
  notes at the stop;
* and it keeps that much room aside on each of them, in an anonymous file (no name: the
  kernel frees it when the job ends, however it ends). When another process fills a disk
  between two checks, the first write refused there frees it and is tried again (the
  state's writer and the output ask :meth:`DiskRoom.release`), the job stops, and what
  it has in flight lands in that room.

A disk filled past that (or a limit a file system does not report, a quota) can still
fail both; the job then says exactly which answers it could keep nowhere, and the rerun
sends those again.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

__all__ = ["MARGIN", "PER_ANSWER", "DiskRoom"]

#: Bytes an answer takes on disk, at least (its state row in whole pages, its output record).
PER_ANSWER = 16 * 1024
#: Bytes kept for the job's notes at the stop (progress, the timeline, the key index...).
MARGIN = 256 * 1024
#: The room kept aside on a disk, at most (a job of thousands in flight still starts quickly).
_RESERVE_MAX = 64 << 20
#: Answers written before what they used is trusted as the measure (the files' own start-up first).
_MEASURED_AFTER = 100


@dataclass(slots=True)
class _Disk:
    #: A file on it (the one the message names).
    path: Path
    device: int
    free_at_start: int
    #: The room kept aside on it (None: none could be, or it was given up).
    reserve: IO[bytes] | None = None
    released: bool = False


class DiskRoom:
    """The file systems a job writes to: whether they still have room for what it has in
    flight, and the room kept aside on each for when another process fills one."""

    __slots__ = ("_disks", "_in_flight", "_lock")

    def __init__(self, paths: Iterable[Path], in_flight: int) -> None:
        self._in_flight = in_flight
        self._lock = threading.Lock()
        disks: dict[int, _Disk] = {}
        for path in paths:
            try:
                device = os.stat(path.parent).st_dev
            except OSError:
                continue
            free = _free(path)
            if free is not None and device not in disks:
                reserve = _reserve(path.parent, min(self.needed(), _RESERVE_MAX), free)
                disks[device] = _Disk(path, device, free, reserve)
        self._disks = list(disks.values())
        for disk in self._disks:  # what is kept aside is not room to use
            disk.free_at_start = _free(disk.path) or 0

    def needed(self, recent: int = 0, per_answer: int = PER_ANSWER) -> int:
        """Bytes the answers in flight (and ``recent`` ones still to write) need, about."""
        return (self._in_flight + recent) * per_answer + MARGIN

    def short(self, answers: int, recent: int = 0) -> str | None:
        """Why the job must stop now (a disk has no room for its answers in flight), or
        None. ``answers``: written this run; ``recent``: of them, since the last check."""
        for disk in self._disks:
            if disk.released:
                return (
                    f"the disk of {disk.path} filled up under the job (another process wrote to it); the room "
                    "kept aside for the answers in flight is theirs"
                )
            free = _free(disk.path)
            if free is None:
                continue
            used = max(0, disk.free_at_start - free)
            per_answer = max(PER_ANSWER, used // answers) if answers >= _MEASURED_AFTER else PER_ANSWER
            needed = self.needed(recent, per_answer)
            if free < needed:
                return (
                    f"the disk is nearly full: {_size(free)} free on the file system of {disk.path}, and the "
                    f"answers of the {self._in_flight:,} requests that may be in flight need about {_size(needed)}; "
                    "stopped while there is room for them"
                )
        return None

    def release(self, path: Path) -> bool:
        """A write to ``path`` found its disk full: free the room kept there. True when
        there was some (try the write again); from any thread."""
        try:
            device = os.stat(path.parent).st_dev
        except OSError:
            return False
        with self._lock:
            for disk in self._disks:
                if disk.device == device and disk.reserve is not None:
                    reserve, disk.reserve = disk.reserve, None
                    disk.released = True
                    reserve.close()
                    return True
        return False

    def close(self) -> None:
        with self._lock:
            for disk in self._disks:
                if disk.reserve is not None:
                    disk.reserve.close()
                    disk.reserve = None


def _reserve(directory: Path, size: int, free: int) -> IO[bytes] | None:
    """An anonymous file of ``size`` bytes in ``directory``, its blocks allocated; None
    when the disk has too little room for it to leave the job any (the check stops it)."""
    if free < 2 * size:
        return None
    try:
        reserve = tempfile.TemporaryFile(dir=directory)  # noqa: SIM115 - held for the whole job
    except OSError:
        return None
    try:
        allocate = getattr(os, "posix_fallocate", None)  # not on macOS: written out instead
        if allocate is not None:
            allocate(reserve.fileno(), 0, size)
        else:
            for _ in range(0, size, 1 << 16):
                reserve.write(bytes(1 << 16))
            reserve.flush()
    except OSError:
        with contextlib.suppress(OSError):
            reserve.close()
        return None
    return reserve


def _free(path: Path) -> int | None:
    """Bytes an unprivileged writer may still use on the file system of ``path``."""
    try:
        stats = os.statvfs(path.parent)
    except OSError:
        return None
    return stats.f_bavail * stats.f_frsize


def _size(n: int) -> str:
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"
