"""Reading answers on asyncio's own loop costs no page fault per read once sluice's HTTP
pool is open (``sluice.providers._read_buffers``).

asyncio reads each chunk into a fresh 256 KiB buffer; until glibc's malloc has raised its
mmap threshold past that, each buffer is a new mapping, touched once: a page fault (and
``mmap``/``mremap``/``munmap``) for every read (the bench's sluice client was found so,
at ~20 µs of kernel time a request). Whether a process is so depends on what it freed
before, so the reads here are of 900 KiB, which only the pool's 1 MiB nudge lifts out of
mmap: counted as the process's minor page faults over 1,000 reads, in a fresh
interpreter each time (the threshold is process state)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

_READS = """
import asyncio, resource, socket, sys

if sys.argv[1] == "pool":
    from sluice.providers import HttpTransport

    async def open_pool() -> None:
        transport = HttpTransport()
        transport.session()
        await transport.aclose()

    asyncio.run(open_pool())
a, b = socket.socketpair()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(1000):
    a.send(b"x" * 400)
    b.recv(900 * 1024)  # asyncio's selector transport asks for 256 KiB a read
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> int:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    result = subprocess.run(
        [sys.executable, "-c", _READS, mode], capture_output=True, text=True, timeout=60, env=env, check=False
    )
    assert result.returncode == 0, result.stderr
    return int(result.stdout)


def _glibc() -> bool:
    try:
        return os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc")  # type: ignore[union-attr]
    except (AttributeError, ValueError, OSError):
        return False


@pytest.mark.skipif(not _glibc(), reason="the mmap threshold is glibc's")
def test_reads_after_the_pool_opens_fault_no_pages() -> None:
    plain = _faults("plain")
    if plain < 500:
        pytest.skip(f"this process's malloc serves 900 KiB from its heap already ({plain} faults)")
    assert _faults("pool") < 50  # a fault a read (1,000) without it
