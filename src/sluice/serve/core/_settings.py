"""``sluice serve``'s own tables in ``sluice.toml``: ``[serve]`` and ``[[client]]``.

::

    [serve]
    max_queue = 256          # requests waiting for capacity at once; past it: 429
    max_wait_s = 30          # the longest a request waits for capacity; past it: 429
    header_timeout_s = 10    # a client must send its headers within this (slowloris)
    body_timeout_s = 30      # ... and its body within this once the headers are in
    max_body_mb = 32         # larger JSON bodies: 413 (uploads have their own limits)
    max_json_values = 1000000  # a JSON body with more values and keys: 413, before it is parsed
    parse_budget_mb = 128    # bytes of JSON bodies read and parsed at once, in all ...
    client_parse_budget_mb = 32  # ... and per client (past them a body waits, up to max_wait_s)
    client_files_mb = 1024   # what one client may keep in files (its batches' outputs count) ...
    client_files = 1000      # ... and how many
    file_ttl_days = 30       # files are deleted so long after they were made (0: never)
    client_uploads = 4       # uploads (and Message Batch bodies) of one client under way at once
    upload_timeout_s = 600   # the longest one upload may take, however steadily it arrives
    cache = false            # false: every request goes upstream; "deterministic": identical
                             # requests at temperature 0 are answered from the state; true: all
    batch_tier = "sync"      # "batch": clients' chat batches through the upstream's Batch API
    prompt_cache = "auto"    # "auto": breakpoints / cache keys for the prefixes clients repeat;
                             # "off": requests go upstream as the clients wrote them
    validate_json = false    # true: answers to a json_schema response_format are validated and
                             # re-asked (up to 5 times); still invalid: a 502 invalid_output
    admin_key_env = "SLUICE_ADMIN_KEY"  # the variable holding the key of /dashboard (see _dashboard)
    metrics_key_env = "SLUICE_METRICS_KEY"  # the variable holding the key /metrics asks for (default: none)
    responses_ttl_days = 30  # a stored response (POST /v1/responses) is kept this long
    responses_mb_per_client = 256  # a client's stored responses; past it its oldest go

    [[client]]
    name = "notebook"
    key_env = "NOTEBOOK_SLUICE_KEY"   # the key stays in the environment
    budget_usd = 5.0                  # kept in the state dir: a restart does not reset it
    rpm = 60
    tpm = 100000
    models = ["openai/gpt-4o-mini"]   # model or deployment names it may use (default: all)
    cache_group = "team-a"            # clients of one group share cached answers (default: its own)

The rest of the file (deployments, retries, budget) is read by :mod:`sluice.cli._config`;
this module reads only these two tables from the same parsed TOML.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..._errors import ConfigError

__all__ = ["ClientSpec", "ServeSettings", "cached_request", "serve_tables"]


@dataclass(frozen=True, slots=True)
class ServeSettings:
    """``[serve]``: the server's limits on waiting and on what clients may send."""

    max_queue: int = 256
    max_wait_s: float = 30.0
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    max_body_mb: float = 32.0
    #: A JSON body with more values and keys than this is refused (413) as it arrives,
    #: before it is parsed: parsed, each costs 40-250 bytes, however few bytes it was sent in.
    max_json_values: int = 1_000_000
    #: Bytes of JSON bodies (over 64 KiB) read and parsed at once, in all and per client;
    #: past them a body waits up to ``max_wait_s`` (then a 503, or a 429 for the client's own).
    parse_budget_mb: float = 128.0
    client_parse_budget_mb: float = 32.0
    #: What one client may keep in ``/v1/files`` (its batches' outputs and Message Batches
    #: count); an upload past it is refused as its bytes arrive.
    client_files_mb: float = 1024.0
    client_files: int = 1000
    #: Days a file is kept after it was made, as OpenAI's batch files (0: for ever).
    file_ttl_days: float = 30.0
    #: Uploads of one client under way at once (the next is a 429), and the longest one may take.
    client_uploads: int = 4
    upload_timeout_s: float = 600.0
    #: Which identical requests are answered from the state: ``"off"`` (none: a client that
    #: samples twice gets two answers), ``"deterministic"`` (those at ``temperature`` 0) or
    #: ``"on"`` (all). A request may turn it off with ``x-sluice-cache: off``, or on when
    #: this is not ``"off"``. Answers are shared within a client's ``cache_group`` only.
    cache: str = "off"
    #: How clients' chat batches (``/v1/batches``) are run: ``"sync"`` (requests through
    #: the engine, at once) or ``"batch"`` (through the provider's Batch API: half price,
    #: within its 24 h window; OpenAI-compatible and Anthropic deployments).
    batch_tier: str = "sync"
    #: Seconds between two looks at a provider batch (``batch_tier = "batch"``).
    batch_poll_every: float = 30.0
    #: The providers' prompt caches: ``"auto"`` marks the prefixes clients keep repeating
    #: (Anthropic breakpoints, OpenAI cache keys per client: ``serve.core._prompt_cache``),
    #: ``"off"`` sends every request as its client wrote it.
    prompt_cache: str = "auto"
    #: Validate answers to a ``response_format`` with a JSON schema (non-streamed chat), for
    #: deployments that cannot guarantee it (see :mod:`sluice.structured`): a client gets JSON
    #: that matches its schema, or a 502 ``invalid_output`` saying what was wrong.
    validate_json: bool = False
    #: The environment variable holding the admin key of ``/dashboard`` (None: no admin key;
    #: the dashboard then answers only on loopback, and only to a server without client keys).
    admin_key_env: str | None = None
    #: The environment variable holding the key ``/metrics`` asks for (``Authorization:
    #: Bearer``); None: ``/metrics`` is open to whoever reaches it.
    metrics_key_env: str | None = None
    #: Days a stored Response is kept (``GET /v1/responses/{id}``, ``previous_response_id``).
    responses_ttl_days: float = 30.0
    #: MB of stored Responses a client may have; a new one pushes out its oldest.
    responses_mb_per_client: float = 256.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "cache", _cache_setting(self.cache, "ServeSettings"))
        _prompt_cache_setting(self.prompt_cache, "ServeSettings")
        if self.batch_tier not in ("sync", "batch"):
            raise ConfigError(f"[serve] batch_tier must be 'sync' or 'batch', got {self.batch_tier!r}")
        if self.admin_key_env is not None:
            _variable_name(self.admin_key_env, "[serve] admin_key_env")
        if self.metrics_key_env is not None:
            _variable_name(self.metrics_key_env, "[serve] metrics_key_env")

    @property
    def max_body_bytes(self) -> int:
        return int(self.max_body_mb * 1024 * 1024)

    @property
    def parse_budget_bytes(self) -> tuple[int, int]:
        """(in all, per client)."""
        return int(self.parse_budget_mb * 1024 * 1024), int(self.client_parse_budget_mb * 1024 * 1024)


@dataclass(frozen=True, slots=True)
class ClientSpec:
    """One ``[[client]]`` entry: who may call, with which key (named, not given), and within what."""

    name: str
    key_env: str
    budget_usd: float | None = None
    rpm: float | None = None
    tpm: float | None = None
    models: tuple[str, ...] | None = None
    #: Clients with the same group share cached answers (None: the client's own name, so
    #: a tenant is never answered from another's requests).
    cache_group: str | None = None


_SERVE_NUMBERS = {
    "max_queue": (1, True),
    "max_wait_s": (0, False),
    "header_timeout_s": (0, False),
    "body_timeout_s": (0, False),
    "max_body_mb": (0, False),
    "max_json_values": (1, True),
    "parse_budget_mb": (0.0625, False),
    "client_parse_budget_mb": (0.0625, False),
    "client_files_mb": (0, False),
    "client_files": (1, True),
    "file_ttl_days": (0, False),
    "client_uploads": (1, True),
    "upload_timeout_s": (1, False),
    "batch_poll_every": (0.1, False),
    "responses_ttl_days": (0, False),
    "responses_mb_per_client": (0, False),
}


def serve_tables(data: Mapping[str, Any], where: str) -> tuple[ServeSettings, tuple[ClientSpec, ...]]:
    """``[serve]`` and ``[[client]]`` from a parsed ``sluice.toml`` (``where`` names it in errors)."""
    return _settings(data.get("serve", {}), where), _clients(data.get("client", []), where)


def _settings(table: Any, where: str) -> ServeSettings:
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: [serve] must be a table")
    known = {
        *_SERVE_NUMBERS,
        "cache",
        "prompt_cache",
        "batch_tier",
        "validate_json",
        "admin_key_env",
        "metrics_key_env",
    }
    extra = sorted(set(table) - known)
    if extra:
        raise ConfigError(f"{where}: [serve]: unknown key(s) {extra}; known: {sorted(known)}")
    for key, (minimum, integer) in _SERVE_NUMBERS.items():
        if key not in table:
            continue
        value = table[key]
        kind = int if integer else (int, float)
        if isinstance(value, bool) or not isinstance(value, kind) or not math.isfinite(value) or value < minimum:
            what = "an integer" if integer else "a number"
            raise ConfigError(f"{where}: [serve] {key} must be {what} >= {minimum}, got {value!r}")
    if "cache" in table:
        _cache_setting(table["cache"], where)  # a bad one named with its file
    if "prompt_cache" in table:
        _prompt_cache_setting(table["prompt_cache"], where)
    if not isinstance(table.get("validate_json", False), bool):
        raise ConfigError(f"{where}: [serve] validate_json must be true or false, got {table['validate_json']!r}")
    if table.get("batch_tier", "sync") not in ("sync", "batch"):
        raise ConfigError(f"{where}: [serve] batch_tier must be 'sync' or 'batch', got {table['batch_tier']!r}")
    for name in ("admin_key_env", "metrics_key_env"):
        if name in table:
            _variable_name(table[name], f"{where}: [serve] {name}")
    return ServeSettings(**table)


def _variable_name(value: Any, where: str) -> None:
    """An environment variable's NAME (keys stay out of files: never echo what may be one)."""
    if not isinstance(value, str) or not value or not value.replace("_", "").isalnum() or value[0].isdigit():
        example = "SLUICE_METRICS_KEY" if "metrics" in where else "SLUICE_ADMIN_KEY"
        raise ConfigError(
            f"{where} must name the environment variable that holds the key (such as '{example}'), not the key itself"
        )


#: ``[serve] cache`` as written -> as kept.
_CACHE_WORDS = {False: "off", True: "on", "off": "off", "on": "on", "deterministic": "deterministic"}


def _cache_setting(value: Any, where: str) -> str:
    if not isinstance(value, (bool, str)) or value not in _CACHE_WORDS:
        raise ConfigError(f'{where}: [serve] cache must be false, true or "deterministic", got {value!r}')
    return _CACHE_WORDS[value]


def _prompt_cache_setting(value: Any, where: str) -> None:
    if value not in ("auto", "off") or not isinstance(value, str):
        raise ConfigError(f'{where}: [serve] prompt_cache must be "auto" or "off", got {value!r}')


def cached_request(setting: str, header: str | None, temperature: object) -> bool:
    """Whether one request may be answered from the state (and stored for its twins): the
    request's ``x-sluice-cache`` header if it gives one, else the server's setting. A
    client cannot turn on what the operator turned off: ``on`` is ignored when the
    setting is ``"off"``."""
    if header is not None:
        asked = header.strip().lower()
        if asked in ("on", "true", "1", "yes"):
            return setting != "off"
        if asked in ("off", "false", "0", "no"):
            return False
        raise ValueError(f"the x-sluice-cache header must be on or off, got {header[:40]!r}")
    if setting == "deterministic":
        return temperature == 0 and not isinstance(temperature, bool)
    return setting == "on"


def _clients(tables: Any, where: str) -> tuple[ClientSpec, ...]:
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise ConfigError(f"{where}: clients are [[client]] tables")
    specs = tuple(_client(t, f"{where}: [[client]] #{i + 1}") for i, t in enumerate(tables))
    names = [s.name for s in specs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"{where}: several [[client]] tables are named {twice[0]!r}; give each its own name")
    return specs


def _client(table: Mapping[str, Any], where: str) -> ClientSpec:
    known = {"name", "key_env", "budget_usd", "rpm", "tpm", "models", "cache_group"}
    extra = sorted(set(table) - known)
    if extra:
        raise ConfigError(f"{where}: unknown key(s) {extra}; known: {sorted(known)}")
    name, key_env = table.get("name"), table.get("key_env")
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"{where}: needs a name (a non-empty string)")
    if not isinstance(key_env, str) or not key_env.strip():
        raise ConfigError(
            f"{where} ({name}): needs key_env, the environment variable holding its key (keys stay out of files)"
        )
    for key in ("budget_usd", "rpm", "tpm"):
        value = table.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ConfigError(f"{where} ({name}): {key} must be a number, got {value!r}")
        if value < 0 or (key != "budget_usd" and value < 1):
            low = "0" if key == "budget_usd" else "1"
            raise ConfigError(f"{where} ({name}): {key} must be >= {low}, got {value!r}")
    models = table.get("models")
    if models is not None and (not isinstance(models, list) or not all(isinstance(m, str) and m for m in models)):
        raise ConfigError(f"{where} ({name}): models must be a list of model or deployment names, got {models!r}")
    group = table.get("cache_group")
    if group is not None and (not isinstance(group, str) or not group.strip()):
        raise ConfigError(f"{where} ({name}): cache_group must be a non-empty string, got {group!r}")
    return ClientSpec(
        name=name,
        key_env=key_env,
        budget_usd=_float(table.get("budget_usd")),
        rpm=_float(table.get("rpm")),
        tpm=_float(table.get("tpm")),
        models=tuple(models) if models is not None else None,
        cache_group=group,
    )


def _float(value: Any) -> float | None:
    return None if value is None else float(value)
