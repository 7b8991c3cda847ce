"""Which ``sluice.toml`` files found in a working directory the user has trusted.

A config file names servers (``base_url``) and the environment variables keys are read
from (``api_key_env``). One that arrives with a cloned repository could send
``$AWS_SECRET_ACCESS_KEY`` to a stranger's server, so a file found implicitly is used
only once the user has said so, the way direnv treats ``.envrc``: ``sluice config
trust`` records the file's absolute path and the SHA-256 of its exact bytes, and any
later edit makes it untrusted again. A file given with ``--config`` is the user's own
say-so and needs no record.

The records live outside any repository, in ``$SLUICE_TRUST_FILE`` or
``$XDG_CONFIG_HOME/sluice/trusted.json`` (``~/.config/sluice/trusted.json``)::

    {"version": 1, "trusted": {"/home/me/project/sluice.toml": "<sha256 hex>"}}

Written by hand because it is a dozen lines over the standard library (hashlib, json,
an atomic ``os.replace``); no maintained package does direnv-style trust for a file.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .._config import TrustState
from .._errors import ConfigError

__all__ = ["TrustCheck", "TrustState", "check_trust", "fingerprint", "revoke", "trust", "trust_file"]

_VERSION = 1


def trust_file() -> Path:
    """Where trust records are kept: never inside the project the config came with."""
    explicit = os.environ.get("SLUICE_TRUST_FILE")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base).expanduser() / "sluice" / "trusted.json"


def fingerprint(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True, slots=True)
class TrustCheck:
    path: Path  # absolute
    state: TrustState


def check_trust(path: Path, data: bytes) -> TrustCheck:
    """Is ``data`` (the exact bytes read from ``path``) what the user trusted?"""
    where = path.resolve()
    recorded = _read(trust_file()).get(str(where))
    if recorded is None:
        return TrustCheck(where, "untrusted")
    return TrustCheck(where, "trusted" if recorded == fingerprint(data) else "changed")


def trust(path: Path, data: bytes) -> Path:
    """Record ``path`` with the digest of ``data``; returns the trust file written."""
    store = trust_file()
    records = _read(store)
    records[str(path.resolve())] = fingerprint(data)
    _write(store, records)
    return store


def revoke(path: Path) -> bool:
    """Forget ``path``; False when it was not trusted."""
    store = trust_file()
    records = _read(store)
    if records.pop(str(path.resolve()), None) is None:
        return False
    _write(store, records)
    return True


def _read(store: Path) -> dict[str, str]:
    try:
        text = store.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise ConfigError(f"cannot read the trust file {store}: {exc.strerror}") from None
    try:
        data = json.loads(text)
        records = data["trusted"]
        if not isinstance(records, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in records.items()
        ):
            raise ValueError
    except (ValueError, KeyError, TypeError):
        raise ConfigError(f"the trust file {store} is damaged; delete it and run `sluice config trust` again") from None
    return dict(records)


def _write(store: Path, records: dict[str, str]) -> None:
    """Whole or not at all (temp file + rename), readable by the user alone."""
    try:
        store.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(prefix=".trusted-", suffix=".tmp", dir=store.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                os.fchmod(f.fileno(), 0o600)
                json.dump({"version": _VERSION, "trusted": records}, f, indent=2, sort_keys=True)
                f.write("\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(temp, store)
        except BaseException:
            Path(temp).unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise ConfigError(f"cannot write the trust file {store}: {exc.strerror}") from None
