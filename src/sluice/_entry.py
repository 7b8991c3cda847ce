"""The ``sluice`` command's first lines: a Ctrl-C before the command has set up its own
handling (while modules load) ends it quietly with status 130, not a traceback."""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # the C module: `signal` takes ms to import (enum)
import sys

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs milliseconds here
if TYPE_CHECKING:
    from types import FrameType


def _interrupted(signum: int, frame: FrameType | None) -> None:
    sys.stderr.write("sluice: interrupted before anything started\n")
    raise SystemExit(130)


def quiet_interrupts() -> None:
    """Until the command sets up its own handling, Ctrl-C ends it quietly (status 130)."""
    _signal.signal(_signal.SIGINT, _interrupted)


def main() -> None:
    quiet_interrupts()
    from .cli import main as cli_main

    cli_main()
