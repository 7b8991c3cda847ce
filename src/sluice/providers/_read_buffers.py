"""Socket reads on asyncio's own loop without a system call and a page fault each.

asyncio's selector transports read every chunk into a fresh 256 KiB buffer
(``recv(max_size)``) and shrink it to what arrived. glibc's malloc serves a block that
large with ``mmap`` until its *dynamic threshold* has been raised past it, which happens
only when a block above the threshold is freed; in a process where that never happened,
every answer costs ``mmap``, ``mremap``, ``munmap`` and a page fault: ~20 µs of kernel
time a response against a fast server (strace, ``bench/README.md``), as much as a tenth
of a request's whole cost, and whether a process pays it depends on what it happened to
free before.

One 1 MiB block, allocated and freed once, raises the threshold as any large free would:
from then on the read buffers come from the heap and are reused. The threshold only ever
goes up, and not at all where the process set its own (``mallopt``,
``MALLOC_MMAP_THRESHOLD_``); nothing changes under any other C library or on uvloop
(which reads into one buffer of its own). Written by hand: no library does this.
"""

from __future__ import annotations

import os

__all__ = ["raise_mmap_threshold"]

_done = False


def raise_mmap_threshold() -> None:
    """Once per process, on glibc: see the module docstring."""
    global _done
    if _done:
        return
    _done = True
    try:
        libc = os.confstr("CS_GNU_LIBC_VERSION")
    except (AttributeError, ValueError, OSError):  # not a POSIX confstr name here
        return
    if libc and libc.startswith("glibc"):
        block = bytearray(1 << 20)  # above the threshold: mmap'd, and freed just below
        del block
