"""The answers every worker of a pipeline shares, keyed by the job: resume, and no row twice.

A worker's Engine is given this as its store, so the engine does what it does with a
state file: a row whose request has a stored answer is not sent again, and an answer is
stored before the row is told. Two places for the answers, the user's choice:

* ``store="redis"`` (the default): one hash per job, ``{ns}:rows:{job}:results``, field
  = a 32-hex digest of the request's store key, value = the kind (``ok`` or the error's)
  and the compact result record (no raw response). The hash expires ``ttl_days`` after
  its last write. A batch's keys are read in one HMGET before it runs (the engine's
  lookups are synchronous), so resume costs one round trip per batch.
* a directory every worker mounts (NFS, a shared disk): one small JSON file per answer,
  written to a temporary name and renamed, so a reader sees all of it or nothing.

Either way the job's counters (answers by kind, dollars of the answers stored) live in
``{ns}:rows:{job}:meta`` on the shared Redis, changed by one Lua script per answer: a
row answered again (a duplicate after a killed worker, or a failure redone) moves its
count, never adds a second one, so progress is right from any machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from .. import _json
from .._errors import StoreError
from .._models import Result
from .._records import error_from_record, result_record
from ..redis import Connection, RedisDown, RedisFailed
from ..store import StoredResult, StoredVector

__all__ = ["DirectoryAnswers", "RedisAnswers", "answer_digest", "job_keys"]

#: Seconds a write that cannot reach Redis is retried before the store gives up (the
#: engine then stops: nothing more is sent that could not be recorded).
_WRITE_PATIENCE = 60.0

# KEYS: meta[, results]; ARGV: field, value, kind, cost in micro-dollars, ttl (s), the
# field's previous kind (a directory store's; '' for none), now. Returns the previous kind.
_PUT = """
local old = ARGV[6]
if #KEYS == 2 then
  local prev = redis.call('HGET', KEYS[2], ARGV[1])
  old = prev and string.match(prev, '^([^\\t]*)') or ''
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
  redis.call('EXPIRE', KEYS[2], ARGV[5])
end
if old ~= ARGV[3] then
  if old ~= '' then redis.call('HINCRBY', KEYS[1], 'n:' .. old, -1) end
  redis.call('HINCRBY', KEYS[1], 'n:' .. ARGV[3], 1)
end
redis.call('HINCRBY', KEYS[1], 'puts', 1)
redis.call('HINCRBY', KEYS[1], 'cost_micro', ARGV[4])
redis.call('HSETNX', KEYS[1], 'started_at', ARGV[7])
redis.call('HSET', KEYS[1], 'updated_at', ARGV[7])
redis.call('EXPIRE', KEYS[1], ARGV[5])
return old
"""


def job_keys(namespace: str, job: str) -> dict[str, str]:
    """The Redis keys of a pipeline job (one hash slot: the job is the hash tag)."""
    base = f"{namespace}:rows:{{{job}}}"
    return {"results": f"{base}:results", "meta": f"{base}:meta", "workers": f"{base}:workers"}


def answer_digest(key: str) -> str:
    """A store key (an id and a content hash, or the hash) in 32 hex digits."""
    return hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def _compact(result: Result) -> dict[str, Any]:
    """The record a rerun needs, without the raw response and empty fields (memory in Redis)."""
    record = result_record(result)
    record.pop("raw", None)
    record["usage"] = {k: v for k, v in record["usage"].items() if v}
    record["at"] = round(time.time(), 3)
    return {k: v for k, v in record.items() if v is not None and v != {}}


def _kind(result: Result) -> str:
    return "ok" if result.ok else (result.error.kind if result.error is not None else "failed")


def _stored(value: bytes | str) -> StoredResult | None:
    raw = value.encode() if isinstance(value, str) else value
    kind, _, body = raw.partition(b"\t")
    try:
        record = _json.loads(body)
    except ValueError:
        return None  # a damaged entry: the row is asked again
    ok = kind == b"ok"
    error = record.get("error")
    kept = not ok and isinstance(error, dict) and error_from_record(error).kept_on_rerun
    return StoredResult(ok, record, kept=kept)


def _vector(value: bytes | None) -> StoredVector | None:
    if value is None:
        return None
    kind, _, rest = value.partition(b"\t")
    header, _, vector = rest.partition(b"\x00")
    try:
        data = _json.loads(header)
    except ValueError:
        return None
    return StoredVector(
        vector if kind == b"ok" else None,
        int(data.get("input_tokens") or 0),
        data.get("cost_usd"),
        int(data.get("attempts") or 0),
        float(data.get("latency_s") or 0.0),
        data.get("deployment"),
        data.get("error"),
    )


class _Answers:
    """What both stores share: the engine's Store protocol, the counters on Redis."""

    def __init__(self, url: str, job: str, *, namespace: str, ttl_seconds: int) -> None:
        self.connection = Connection(url, namespace=namespace)
        self.keys = job_keys(namespace, job)
        self.ttl = ttl_seconds
        self._known: dict[str, StoredResult] = {}
        self._missing: set[str] = set()
        self._error: StoreError | None = None
        self._intents = 0

    # -- the Store protocol ----------------------------------------------------------------

    def get(self, key: str) -> StoredResult | None:
        found = self._known.get(key)
        if found is not None or key in self._missing:
            return found
        return self._read_one(key)

    async def begin(self, key: str, worst_usd: float) -> int:
        """Nothing to note: the shared budget holds the attempt's worst case (a dead
        worker's hold is counted as spent), which is what an intent is for."""
        self._intents += 1
        return self._intents

    def settle(self, intent: int, charged_usd: float, *, answered: bool) -> None:
        return None

    async def put(self, key: str, result: Result) -> None:
        record = _compact(result)
        kind = _kind(result)
        value = kind.encode() + b"\t" + _json.dumps(record)
        cost = round((result.cost_usd or 0.0) * 1_000_000)
        await self._write(answer_digest(key), value, kind, cost)
        kept = result.error is not None and result.error.kept_on_rerun
        self._known[key] = StoredResult(result.ok, record, kept=kept)
        self._missing.discard(key)

    @property
    def error(self) -> StoreError | None:
        return self._error

    def close(self) -> None:
        return None

    # -- the VectorStore protocol (embeddings) ------------------------------------------

    def get_vectors(self, keys: Sequence[str]) -> dict[str, StoredVector]:
        """Stored vectors of ``keys`` (one blocking read: the pipeline asks for many at once)."""
        keys = list(dict.fromkeys(keys))
        found = self._read_sync([answer_digest(k) for k in keys])
        return {key: vector for key, value in zip(keys, found, strict=True) if (vector := _vector(value)) is not None}

    async def put_vectors(self, rows: Sequence[tuple[str, StoredVector]]) -> None:
        for key, row in rows:
            header = {
                "input_tokens": row.input_tokens,
                "cost_usd": row.cost_usd,
                "attempts": row.attempts,
                "latency_s": row.latency_s,
                "deployment": row.deployment,
                "error": row.error,
                "at": round(time.time(), 3),
            }
            kind = "ok" if row.ok else str((row.error or {}).get("type", "failed"))
            value = kind.encode() + b"\t" + _json.dumps(header) + b"\x00" + (row.vector or b"")
            await self._write(answer_digest(key), value, kind, round((row.cost_usd or 0.0) * 1_000_000))

    # -- batches ---------------------------------------------------------------------------

    async def prefetch(self, keys: Iterable[str]) -> None:
        """Read the stored answers of a batch's keys at once (``get`` is synchronous)."""
        wanted = [k for k in dict.fromkeys(keys) if k not in self._known]
        if not wanted:
            return
        found = await self._read_many([answer_digest(k) for k in wanted])
        for key, value in zip(wanted, found, strict=True):
            stored = _stored(value) if value is not None else None
            if stored is None:
                self._missing.add(key)
            else:
                self._known[key] = stored

    def forget(self, keys: Iterable[str]) -> None:
        """A batch is done: its answers need not stay in memory."""
        for key in keys:
            self._known.pop(key, None)
            self._missing.discard(key)

    async def aclose(self) -> None:
        await self.connection.close()

    # -- where the answers go (the two stores) ---------------------------------------------

    async def _read_many(self, digests: list[str]) -> list[bytes | None]:
        raise NotImplementedError

    def _read_one(self, key: str) -> StoredResult | None:
        found = self._read_sync([answer_digest(key)])[0]
        return _stored(found) if found is not None else None

    def _read_sync(self, digests: list[str]) -> list[bytes | None]:
        raise NotImplementedError

    async def _write(self, digest: str, value: bytes, kind: str, cost_micro: int) -> None:
        raise NotImplementedError

    async def _count(self, keys: list[str], digest: str, value: bytes, kind: str, cost: int, old: str) -> Any:
        """Run the counting script until Redis takes it (``_WRITE_PATIENCE`` at most)."""
        deadline = time.monotonic() + _WRITE_PATIENCE
        args = [digest, value, kind, cost, self.ttl, old, round(time.time(), 3)]
        while True:
            try:
                return await self.connection.run("rows_put", _PUT, keys, args)
            except RedisDown as exc:
                if time.monotonic() > deadline:
                    self._error = StoreError(f"cannot record answers: {exc.message}")
                    raise self._error from None
                await asyncio.sleep(self.connection.backoff())
            except RedisFailed as exc:
                self._error = StoreError(f"cannot record answers: {exc.message}")
                raise self._error from None


class RedisAnswers(_Answers):
    """Answers in a Redis hash per job (see the module docstring)."""

    def __init__(self, url: str, job: str, *, namespace: str = "sluice", ttl_seconds: int = 7 * 86_400) -> None:
        super().__init__(url, job, namespace=namespace, ttl_seconds=ttl_seconds)
        self._sync: Any = None

    async def _read_many(self, digests: list[str]) -> list[bytes | None]:
        found: list[bytes | None] = []
        for start in range(0, len(digests), 1000):
            chunk = digests[start : start + 1000]
            found += await self.connection.call(self.connection.client.hmget(self.keys["results"], chunk))
        return found

    async def aclose(self) -> None:
        if self._sync is not None:
            self._sync.close()
            self._sync = None
        await super().aclose()

    def _read_sync(self, digests: list[str]) -> list[bytes | None]:
        """Keys no batch read ahead, and vectors (blocks for a round trip)."""
        import redis

        if self._sync is None:
            self._sync = redis.Redis.from_url(self.connection.url, socket_timeout=5.0)
        try:
            return list(self._sync.hmget(self.keys["results"], digests)) if digests else []
        except redis.RedisError:
            return [None] * len(digests)  # not known now: asked again (the budget and limits still hold)

    async def _write(self, digest: str, value: bytes, kind: str, cost_micro: int) -> None:
        await self._count([self.keys["meta"], self.keys["results"]], digest, value, kind, cost_micro, "")


class DirectoryAnswers(_Answers):
    """Answers as files under ``root/job/``, one per row (see the module docstring)."""

    def __init__(
        self, root: str | Path, url: str, job: str, *, namespace: str = "sluice", ttl_seconds: int = 7 * 86_400
    ) -> None:
        super().__init__(url, job, namespace=namespace, ttl_seconds=ttl_seconds)
        self.root = Path(root) / job
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"store={root}: cannot make the job's directory: {exc.strerror or exc}") from None

    def _path(self, digest: str) -> Path:
        return self.root / digest[:2] / f"{digest}.json"

    def _read(self, digest: str) -> bytes | None:
        try:
            return self._path(digest).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreError(f"cannot read an answer under {self.root}: {exc.strerror or exc}") from None

    async def _read_many(self, digests: list[str]) -> list[bytes | None]:
        return await asyncio.to_thread(lambda: [self._read(d) for d in digests])

    def _read_sync(self, digests: list[str]) -> list[bytes | None]:
        return [self._read(d) for d in digests]

    async def _write(self, digest: str, value: bytes, kind: str, cost_micro: int) -> None:
        old = await asyncio.to_thread(self._replace, digest, value)
        await self._count([self.keys["meta"]], digest, value, kind, cost_micro, old)

    def _replace(self, digest: str, value: bytes) -> str:
        """Write the answer whole (a temporary file renamed over it); the kind it replaced."""
        path = self._path(digest)
        try:
            path.parent.mkdir(exist_ok=True)
            previous = self._read(digest)
            fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                f.write(value)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temporary, path)
        except OSError as exc:
            with contextlib.suppress(OSError, UnboundLocalError):
                os.unlink(temporary)
            self._error = StoreError(f"cannot write an answer under {self.root}: {exc.strerror or exc}")
            raise self._error from None
        return previous.partition(b"\t")[0].decode() if previous else ""
