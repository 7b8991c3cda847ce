"""What a key of ``sluice serve`` must be, and what makes one look weak.

Every key the server takes (a client's, the admin key of ``/dashboard``, the key of
``/metrics``) is read from an environment variable at start-up, where a missing, short or
non-ASCII one stops the server (:func:`check_key`). A key that passes but looks guessable
(few different characters, a repeated piece, mostly a run like ``1234`` or ``abcd``) is
only warned about in the operator's log (:func:`warn_if_weak`): the operator may have a
reason, but a login that can be tried from anywhere deserves a random key. Nothing here
ever says a key, or any part of it.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from aiohttp import web

from ..._errors import ConfigError

if TYPE_CHECKING:
    from ._clients import Clients

__all__ = ["MIN_KEY", "bearer", "check_key", "operator_key", "same_key", "warn_if_weak", "weakness"]

_log = logging.getLogger("sluice.serve")

MIN_KEY = 16
#: Fewer different characters than this looks chosen, not drawn (16 random hex digits
#: have fewer about once in a hundred keys).
_MIN_DISTINCT = 8


def check_key(key: str, where: str) -> None:
    """A ConfigError unless ``key`` may be a key; ``where`` names it (``the key in $NAME``)."""
    if len(key) < MIN_KEY:
        raise ConfigError(f"{where} is shorter than {MIN_KEY} characters")
    if not key.isascii() or not key.isprintable():
        raise ConfigError(f"{where} must be printable ASCII")


def operator_key(name: str | None, what: str, clients: Clients, environ: Mapping[str, str] | None = None) -> str | None:
    """The ``what`` key (``admin``, ``metrics``) in ``$name``, None when ``name`` is: a
    ConfigError when it is unset, is no key (:func:`check_key`) or is a client's; a warning
    when it looks weak."""
    if name is None:
        return None
    setting = f"[serve] {what}_key_env"
    key = (os.environ if environ is None else environ).get(name, "")
    if not key:
        raise ConfigError(f"{setting}: the {what} key variable ${name} is not set")
    check_key(key, f"{setting}: the key in ${name}")
    if not clients.anonymous and clients.authenticate(key) is not None:
        raise ConfigError(f"{setting}: the key in ${name} is a client's key; give the {what} key its own")
    warn_if_weak(key, f"{setting}: the key in ${name}")
    return key


def weakness(key: str) -> str | None:
    """Why ``key`` looks guessable, or None."""
    distinct = len(set(key))
    if distinct < _MIN_DISTINCT:
        return f"it has only {distinct} different characters"
    for period in range(1, len(key) // 2 + 1):
        if key == (key[:period] * (len(key) // period + 1))[: len(key)]:
            return f"it repeats a piece of {period} characters"
    steps = sum(1 for a, b in itertools.pairwise(key) if abs(ord(a) - ord(b)) <= 1)
    if steps * 2 > len(key) - 1:
        return "most of it runs in sequence (like 1234 or abcd)"
    return None


def warn_if_weak(key: str, where: str) -> None:
    """Say in the operator's log that ``key`` looks weak (never the key itself)."""
    why = weakness(key)
    if why is not None:
        _log.warning("sluice serve: %s looks weak (%s); use a random one, e.g. $(openssl rand -hex 24)", where, why)


def bearer(request: web.Request) -> str | None:
    """The key of ``Authorization: Bearer <key>``, if the request gives one."""
    scheme, _, key = request.headers.get("authorization", "").partition(" ")
    return key.strip() if scheme.lower() == "bearer" else None


def same_key(given: str | None, digest: bytes) -> bool:
    """Whether ``given`` is the key whose SHA-256 is ``digest`` (in constant time)."""
    if not given or not given.isascii():  # never a key of ours, and it may not even encode
        return False
    return hmac.compare_digest(hashlib.sha256(given.encode()).digest(), digest)
