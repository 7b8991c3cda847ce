"""Whether a state file is at rest: no job is writing it, so a reader may open it as
immutable (and leave no ``-wal``/``-shm`` files beside it)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["at_rest"]


def at_rest(path: Path) -> bool:
    """Whether no job is writing the state (none holds its lock, no WAL beside it). A
    reader then opens it as immutable: SQLite makes no ``-wal`` and ``-shm`` beside it
    (a read-only connection could not remove them again), and ``sluice report`` leaves
    nothing behind."""
    try:
        import fcntl
    except ImportError:  # no flock (Windows): the ordinary read-only open
        return False
    if Path(f"{path}-wal").exists():
        return False
    try:
        with open(path, "rb") as handle:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)  # a running job holds it exclusively
            fcntl.flock(handle, fcntl.LOCK_UN)
    except OSError:  # locked by a job, or not readable: the ordinary open says what is wrong
        return False
    return True
