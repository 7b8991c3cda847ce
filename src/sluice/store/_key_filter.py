"""A Bloom filter of a run's keys: what the state spares a lookup for (``_sqlite``)."""

from __future__ import annotations

__all__ = ["KeyFilter"]


class KeyFilter:
    """A Bloom filter of keys: "certainly not here" or "maybe".

    A set of a million keys would cost ~100 MB. Sized at 64 bits a key for the keys the
    job expects (a power of two, 8 KB to 64 MB; 16 MB when nobody says), with eight
    probes, a whole run expects 0.006 false "maybe"s at a million lines, 0.05 at eight
    million and 0.3 at ten million (four probes into a fixed 16 MB expected 0.3 at one
    million and 9 at two). That matters: the first one in a run without the key index
    builds it (see the module's docstring), and the run goes on slower, never wrong."""

    __slots__ = ("_bits", "_mask")

    _BITS_PER_KEY = 64
    _MIN_BITS = 1 << 16
    _MAX_BITS = 1 << 29
    _DEFAULT_BITS = 1 << 27

    def __init__(self, keys: int | None = None) -> None:
        size = self._DEFAULT_BITS
        if keys is not None:
            size = min(self._MAX_BITS, max(self._MIN_BITS, 1 << (keys * self._BITS_PER_KEY - 1).bit_length()))
        self._bits = bytearray(size // 8)
        self._mask = size - 1

    @property
    def size_bytes(self) -> int:
        return len(self._bits)

    # The probes are written out by hand: this runs twice per result of a batch job.
    # Eight from one 64-bit hash (Kirsch-Mitzenmacher double hashing).

    def add(self, key: str) -> bool:
        """Add ``key``; whether it may have been here already."""
        h = hash(key) & 0xFFFFFFFFFFFFFFFF
        mask, bits = self._mask, self._bits
        spot, step = h & mask, (h >> 32) | 1
        present = True
        for _ in range(8):
            byte, bit = spot >> 3, 1 << (spot & 7)
            value = bits[byte]
            if not value & bit:
                present = False
                bits[byte] = value | bit
            spot = (spot + step) & mask
        return present

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.may_hold(key)

    def may_hold(self, key: str) -> bool:
        h = hash(key) & 0xFFFFFFFFFFFFFFFF
        mask, bits = self._mask, self._bits
        spot, step = h & mask, (h >> 32) | 1
        for _ in range(8):
            if not bits[spot >> 3] & (1 << (spot & 7)):
                return False  # the common case for a new key: out at the first probe or so
            spot = (spot + step) & mask
        return True
