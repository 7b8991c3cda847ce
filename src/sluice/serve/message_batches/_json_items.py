"""A JSON object read from a file a piece at a time: its keys, and the items of an array
value each as its own bytes, never the whole document in memory.

A Message Batch body is ``{"requests": [item, item, ...]}`` of up to 256 MB: parsed whole,
255 MB of ``{}`` items made 8 GB of objects. :class:`JsonScan` walks the text with regexes
that skip strings whole (a base64 image is one step), tracking only bracket depth, and
hands each item over as bytes; the caller checks its size and parses it alone (orjson,
which also finds what is wrong inside it). Memory: the largest item, plus a chunk.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import BinaryIO

from ... import _json

__all__ = ["ItemTooLarge", "JsonScan", "NotJson"]

_CHUNK = 1 << 20
_SPACE = b" \t\r\n"
#: From a point inside a value: every byte that neither moves depth nor ends an item, whole
#: strings included (a base64 image is one step), in C; it stops at ``[ ] { } ,``, at a
#: string the buffer ends inside, or at the buffer's end.
_SKIP = re.compile(rb'(?:[^"\[\]{},]++|"[^"\\]*+(?:\\.[^"\\]*+)*+")*+', re.DOTALL)
#: A whole string from its opening quote; group 1 is empty when the buffer ends inside it.
_STRING = re.compile(rb'"[^"\\]*+(?:\\.[^"\\]*+)*+("?)', re.DOTALL)


class NotJson(ValueError):
    """The document is not JSON where the scan reached."""


class ItemTooLarge(Exception):
    """An item is longer than the caller takes (it is not read further)."""


class JsonScan:
    """A cursor over ``source``: ``peek``/``take`` single characters between values,
    :meth:`key` for an object's key, :meth:`items` for an array's items."""

    def __init__(self, source: BinaryIO, chunk: int = _CHUNK) -> None:
        self._source = source
        self._chunk = chunk
        self._buf = b""
        self._pos = 0
        self._eof = False

    def _more(self, keep_from: int) -> int:
        """Read on, keeping the buffer from ``keep_from`` (its new index is returned: 0).
        False-y ``_eof`` afterwards means something was added."""
        chunk = self._source.read(self._chunk)
        self._buf = self._buf[keep_from:] + chunk
        self._pos -= keep_from
        if not chunk:
            self._eof = True
        return 0

    def peek(self) -> bytes:
        """The next character that is not white space (``b""`` at the end)."""
        while True:
            while self._pos < len(self._buf) and self._buf[self._pos] in _SPACE:
                self._pos += 1
            if self._pos < len(self._buf):
                return self._buf[self._pos : self._pos + 1]
            if self._eof:
                return b""
            self._more(self._pos)

    def take(self, char: bytes) -> None:
        if self.peek() != char:
            raise NotJson(f"expected {char.decode()!r}")
        self._pos += 1

    def key(self) -> str:
        """An object's key and its colon."""
        if self.peek() != b'"':
            raise NotJson("expected a key")
        while not (found := _STRING.match(self._buf, self._pos)) or not found.group(1):
            if self._eof or len(self._buf) - self._pos > 4096:
                raise NotJson("a key that does not end")
            self._more(self._pos)
        try:
            key = _json.loads(found.group(0))
        except ValueError:
            raise NotJson("a key is not a valid JSON string") from None
        self._pos = found.end()
        self.take(b":")
        return str(key)

    def items(self, max_bytes: int) -> Iterator[bytes]:
        """An array's items (from its ``[`` to its ``]``), each as its bytes;
        :class:`ItemTooLarge` for one longer than ``max_bytes``."""
        self.take(b"[")
        if self.peek() == b"]":
            self._pos += 1
            return
        while True:
            yield self._value(max_bytes)
            if self.peek() == b",":
                self._pos += 1
                continue
            self.take(b"]")
            return

    def _value(self, max_bytes: int) -> bytes:
        """One value's bytes from here: up to the ``,``, ``]`` or ``}`` that ends it at its own depth."""
        self.peek()
        start = at = self._pos
        depth = 0
        while True:
            at = _SKIP.match(self._buf, at).end()  # type: ignore[union-attr]  # it matches anywhere
            if at - start > max_bytes:
                raise ItemTooLarge()
            if at >= len(self._buf) or self._buf[at] == 0x22:  # the buffer ends (inside a string, maybe)
                if not self._eof:
                    at -= start
                    start = self._more(start)
                    continue
                if depth == 0 and at >= len(self._buf):
                    return self._done(start, at)  # a bare scalar at the very end
                raise NotJson("the document ends inside a value")
            char = self._buf[at]
            if char in b"[{":
                depth += 1
            elif depth == 0:  # , ] or } after a scalar or string
                return self._done(start, at)
            elif char != 0x2C:
                depth -= 1
                if depth == 0:
                    return self._done(start, at + 1)
            at += 1

    def _done(self, start: int, end: int) -> bytes:
        self._pos = end
        value = self._buf[start:end].rstrip(_SPACE)
        if not value:
            raise NotJson("expected a value")
        return value
