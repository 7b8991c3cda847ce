"""Wrong keys per remote address, and how long an address must wait before its next key
is checked (the dashboard's login: anyone may post there).

An address's first :data:`FREE` wrong keys cost nothing (a typo must not lock the admin
out); each one after doubles its wait, from :data:`BASE` seconds up to :data:`CAP`. A
key sent while the address waits is not checked at all (it is answered 429 with
``Retry-After``), so a guesser gets about ``FREE + log2(seconds)`` tries, however fast it
sends. The right key clears the address. Memory is bounded: at most :data:`ENTRIES`
addresses are remembered, the least recently seen forgotten first, and an address quiet
for :data:`FORGET` seconds is forgotten anyway. An IPv6 address counts by its /64 (one
host has many). Behind a reverse proxy every request comes from the proxy's address.
"""

from __future__ import annotations

import ipaddress
import math
import time
from collections import OrderedDict
from collections.abc import Callable

__all__ = ["BASE", "CAP", "ENTRIES", "FORGET", "FREE", "Backoff", "retry_after"]

FREE = 5
BASE = 1.0
CAP = 300.0
ENTRIES = 4096
FORGET = 900.0


class _Entry:
    __slots__ = ("failures", "seen", "until")

    def __init__(self, now: float) -> None:
        self.failures = 0
        self.until = 0.0
        self.seen = now


class Backoff:
    """Per-address exponential backoff of wrong keys (see the module docstring)."""

    __slots__ = ("_entries", "cap", "clock", "entries", "forget", "free")

    def __init__(
        self,
        *,
        free: int = FREE,
        cap: float = CAP,
        entries: int = ENTRIES,
        forget: float = FORGET,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.free = free
        self.cap = cap
        self.entries = entries
        self.forget = forget
        #: What time it is (tests give a virtual clock).
        self.clock = clock
        self._entries: OrderedDict[str, _Entry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def wait(self, address: str | None) -> float:
        """Seconds before a key from ``address`` is checked again (0: now)."""
        entry = self._entries.get(_who(address))
        return 0.0 if entry is None else max(0.0, entry.until - self.clock())

    def failed(self, address: str | None) -> None:
        """A wrong key came from ``address``: past the free ones, its wait doubles."""
        now = self.clock()
        who = _who(address)
        entry = self._entries.pop(who, None)
        if entry is None:
            entry = _Entry(now)
        self._entries[who] = entry  # the most recently seen, last
        entry.failures += 1
        entry.seen = now
        beyond = entry.failures - self.free
        if beyond > 0:
            entry.until = now + min(self.cap, BASE * 2.0 ** min(beyond - 1, 64))
        self._trim(now)

    def succeeded(self, address: str | None) -> None:
        """The right key came from ``address``: it starts afresh."""
        self._entries.pop(_who(address), None)

    def _trim(self, now: float) -> None:
        entries = self._entries
        while entries:
            oldest = next(iter(entries.values()))
            if len(entries) <= self.entries and now - oldest.seen < max(self.forget, oldest.until - oldest.seen):
                return
            entries.popitem(last=False)


def retry_after(seconds: float) -> str:
    """``Retry-After`` for a wait: whole seconds, at least one."""
    return str(max(1, math.ceil(seconds)))


def _who(address: str | None) -> str:
    """The key an address is counted under: itself, or its /64 for IPv6."""
    if not address:
        return "-"
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address[:64]
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)
