"""Prices genai-prices gave before, kept on disk so a new process need not import it again.

Importing genai-prices (its data, pydantic and httpx) costs ~0.25 s and leaves ~30,000
objects that every full garbage collection walks for the rest of the process, all for a
few rates per deployment. Each lookup's answer (flat rates, "tiered" or "unknown") is
written to a small JSON file in the user's cache directory (``platformdirs``; the
variable ``SLUICE_CACHE_DIR`` moves it), with the providers' URL patterns a lookup by
URL needs. A process that finds its answers there never imports genai-prices.

An entry is only used while it is certainly what genai-prices would say now:
- the file names the installed genai-prices data (path, size and modification time of
  its ``data.py``), so an upgrade starts it afresh;
- it was written on the same UTC day: genai-prices' prices can change on a date;
- genai-prices is not imported in this process: once it is, the live library answers
  (a custom snapshot or ``UpdatePrices`` may be in force), and an answer from anything but
  the bundled data is never written.

Written by hand because no library caches another library's answers this way; the file
is replaced atomically and any failure to read or write it (read-only home, full disk)
only means the live lookup.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

__all__ = ["PriceCache", "price_cache"]

log = logging.getLogger("sluice.pricing")

#: Entries in one file at most (one day's distinct lookups); past it the file starts over.
MAX_ENTRIES = 1000
_FORMAT = 1


def _data_identity() -> str | None:
    """Which genai-prices data is installed, without importing it; None when not found."""
    from importlib.util import find_spec

    try:
        spec = find_spec("genai_prices")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    data = Path(next(iter(spec.submodule_search_locations))) / "data.py"
    try:
        stat = data.stat()
    except OSError:
        return None
    return f"{data}:{stat.st_size}:{stat.st_mtime_ns}"


def _default_directory() -> Path:
    configured = os.environ.get("SLUICE_CACHE_DIR")
    if configured:
        return Path(configured)
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("sluice", appauthor=False))


class PriceCache:
    """One cache file: ``get``/``put`` entries, ``known_url`` from the stored URL patterns."""

    def __init__(self, directory: Path | None = None) -> None:
        self._directory = directory
        self._loaded: dict[str, Any] | None = None
        self._identity: str | None = None

    @property
    def path(self) -> Path:
        return (self._directory or _default_directory()) / f"prices-v{_FORMAT}.json"

    def usable(self) -> bool:
        """Whether answers may come from here: genai-prices is not imported in this process."""
        return "genai_prices" not in sys.modules

    def get(self, key: str) -> dict[str, Any] | None:
        """The stored answer for ``key``, if it is today's for the installed data."""
        entries = self._contents().get("entries")
        entry = entries.get(key) if isinstance(entries, dict) else None
        return entry if isinstance(entry, dict) else None

    def known_url(self, url: str) -> bool | None:
        """Whether ``url`` matches a provider's URL pattern; None when none are stored."""
        import re

        patterns = self._contents().get("api_patterns")
        if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
            return None
        try:
            return any(re.match(p, url) for p in patterns)
        except re.error:
            return None

    def put(self, key: str, entry: dict[str, Any], api_patterns: list[str]) -> None:
        """Store ``entry`` (with the patterns of the data it came from); failures are logged only."""
        contents = self._contents()
        entries = dict(contents.get("entries") or {})
        if len(entries) >= MAX_ENTRIES:
            entries = {}
        entries[key] = entry
        fresh = {"source": self._source(), "entries": entries, "api_patterns": api_patterns}
        self._loaded = fresh
        path = self.path
        import tempfile

        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".prices-", suffix=".json")
        except OSError as exc:
            log.debug("could not write the price cache %s: %s", path, exc)
            return
        try:
            with os.fdopen(handle, "w", encoding="utf-8") as out:
                json.dump(fresh, out)
            os.replace(temporary, path)
        except OSError as exc:
            log.debug("could not write the price cache %s: %s", path, exc)
            with contextlib.suppress(OSError):
                os.unlink(temporary)

    def _source(self) -> str | None:
        if self._identity is None:
            identity = _data_identity()
            if identity is None:
                return None
            self._identity = f"{identity}:{datetime.datetime.now(datetime.UTC).date().isoformat()}"
        return self._identity

    def _contents(self) -> dict[str, Any]:
        if self._loaded is None:
            self._loaded = self._read()
        return self._loaded

    def _read(self) -> dict[str, Any]:
        source = self._source()
        if source is None:
            return {}
        try:
            contents = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        if not isinstance(contents, dict) or contents.get("source") != source:
            return {}
        return contents


_shared: PriceCache | None = None


def price_cache() -> PriceCache:
    """The process's cache (its file is read once)."""
    global _shared
    if _shared is None:
        _shared = PriceCache()
    return _shared
