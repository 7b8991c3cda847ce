"""The ``sluice`` command's first lines: a Ctrl-C before the command has set up its own
handling (while modules load) ends it quietly with status 130, never a traceback or a crash.

The handler must not raise: Python runs it at the next bytecode, which may be inside a
native extension's import (orjson imports ``uuid`` from its C init), and an exception
surfacing there segfaults the interpreter. It writes one line with ``os.write`` (not
``sys.stderr``, whose buffer may be mid-write) and leaves with ``os._exit``: nothing the
command owns is open yet, and whatever is loading needs no clean-up.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # the C module: `signal` takes ms to import (enum)
import os  # already loaded by the interpreter's start-up: free

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs milliseconds here
if TYPE_CHECKING:
    from types import FrameType

#: 128 + SIGINT, as a shell reports a process stopped by Ctrl-C.
EXIT_INTERRUPTED = 130


def _interrupted(signum: int, frame: FrameType | None) -> None:
    os.write(2, b"sluice: interrupted\n")
    os._exit(EXIT_INTERRUPTED)


def is_the_command(argv: list[str]) -> bool:
    """Whether this interpreter was started as the ``sluice`` command (``sys.orig_argv``):
    the console script, or ``python -m sluice``. Not ``python -m app`` whose package imports
    sluice (``sys.argv[0]`` is ``"-m"`` for any module while its packages load), whose own
    Ctrl-C handling and clean-up must stay as they are."""
    if argv and os.path.basename(argv[0]) == "sluice":  # a frozen or exec'd command
        return True
    args = iter(argv[1:])
    for arg in args:
        if arg in ("-m", "-c"):
            return arg == "-m" and next(args, None) == "sluice"
        if arg.startswith(("-m", "-c")) and not arg.startswith("--"):
            return arg == "-msluice"
        if arg in ("-X", "-W", "--check-hash-based-pycs"):
            next(args, None)  # the option's value
        elif not arg.startswith("-"):  # the script, .../bin/sluice for the console script
            return os.path.basename(arg) == "sluice"
    return False


def quiet_interrupts() -> None:
    """Until the command sets up its own handling, Ctrl-C ends it quietly (status 130)."""
    _signal.signal(_signal.SIGINT, _interrupted)


def main() -> None:
    quiet_interrupts()
    from .cli import main as cli_main

    cli_main()
