"""A batch job's Redis side: the registry, the request and result streams, heartbeats,
claiming and dead letters. One :class:`JobQueue` per job; no Engine in here.

Keys, under the namespace (``sluice``)::

    {ns}:jobs                  SET   ids of running jobs (workers join what is here)
    {ns}:job:{id}              HASH  status, settings (no keys, no base URLs)
    {ns}:job:{id}:requests     STREAM + group "workers": what is to be answered
    {ns}:job:{id}:results      STREAM + group "coordinator": answers and dead letters
    {ns}:job:{id}:done         SET   lines answered lately (checked before sending)
    {ns}:job:{id}:errors       HASH  line -> the last error of a request given back
    {ns}:workers               SET   worker names; {ns}:worker:{name} (TTL) is alive

A worker records an answer in one transaction (XADD result, SADD done, XACK, XDEL), so
an entry still in the request stream is exactly one not yet answered: the stream's length
is what is undelivered or in flight, which the coordinator keeps bounded. A worker
touches the entries it holds every few seconds (XCLAIM JUSTID, by a script that checks
it still owns them); an entry idle longer than ``claim_after`` belongs to a worker that
stopped, and XAUTOCLAIM gives it to another.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ResponseError

from ..structured import MAX_REASKS
from ._connection import UNREACHABLE, closed_socket_aware

__all__ = [
    "UNREACHABLE",
    "Delivery",
    "JobQueue",
    "JobSettings",
    "WorkerRegistry",
    "connect",
    "job_id_for",
    "jobs_channel",
    "running_jobs",
]

WORKERS_GROUP = "workers"
COORDINATOR_GROUP = "coordinator"
COORDINATOR = "coordinator"
#: An entry given back is marked this idle (ms) so that the next XAUTOCLAIM takes it at once.
_GIVEN_BACK_IDLE_MS = 10**9
#: The shortest idle time (s) after which a worker takes an entry another holds.
MIN_CLAIM_AFTER = 0.5
#: How long a finished job's hash stays, for workers that have not noticed yet.
_FINISHED_TTL_S = 3600
#: A job whose coordinator has not been heard from for this long is abandoned: workers
#: take it off the running jobs (they would otherwise join it forever) and its keys expire
#: a week later. The coordinator's rerun registers it again and finds what is left.
ABANDONED_AFTER_S = 3600
_ABANDONED_KEYS_TTL_S = 7 * 24 * 3600

# KEYS: coordinator, registry, meta, requests, results, done, errors; ARGV: job id, ttl.
# One step, so a coordinator coming back cannot be abandoned between the check and the act.
_ABANDON = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
if redis.call('HGET', KEYS[3], 'status') ~= 'running' then return 0 end
redis.call('SREM', KEYS[2], ARGV[1])
redis.call('HSET', KEYS[3], 'status', 'abandoned')
for i = 3, 7 do redis.call('EXPIRE', KEYS[i], ARGV[2]) end
return 1
"""

# Refresh the idle time of the entries this consumer still owns; return those it lost.
# A plain XCLAIM would take an entry back from a worker that claimed it meanwhile.
_TOUCH = """
local lost = {}
for i = 3, #ARGV do
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)
  if p[1] ~= nil and p[1][2] == ARGV[2] then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'JUSTID')
  else
    table.insert(lost, ARGV[i])
  end
end
return lost
"""


def connect(url: str, *, timeout: float = 5.0) -> aioredis.Redis:
    """A client that fails fast when Redis is away (callers wait and retry themselves,
    and say so), and decodes nothing (bodies are JSON bytes). Its pool is closed with
    the client (``aclose``)."""
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        max_connections=64,  # requests in flight wait for a connection, not fail for lack of one
        timeout=None,
        # One immediate retry replaces a connection Redis dropped (it restarted); no hidden
        # backoff: an outage shows at once, and the caller says so and waits.
        retry=Retry(NoBackoff(), 1),
        socket_connect_timeout=timeout,
        socket_timeout=timeout + 2.0,
        health_check_interval=0,
    )
    client: aioredis.Redis = aioredis.Redis.from_pool(closed_socket_aware(pool))
    return client


def job_id_for(host: str, state: str, started_at: object) -> str:
    """The job's id: its state file's identity (machine, path, first start), so a rerun of
    the coordinator finds the job again and a new state file makes a new job."""
    identity = f"{host}\x1f{state}\x1f{started_at}".encode()
    return hashlib.blake2b(identity, digest_size=8).hexdigest()


@dataclass(frozen=True, slots=True)
class JobSettings:
    """What the coordinator tells workers about a job. Never a key or a base URL: each
    worker reaches providers with its own environment and config."""

    budget_usd: float | None = None
    allow_unpriced: bool = False
    #: Limits (``rpm``, ``tpm``, ``max_in_flight``...) and prices per deployment, for workers
    #: whose own config does not name the model.
    deployments: tuple[Mapping[str, Any], ...] = ()
    defaults: Mapping[str, Any] | None = None
    claim_after: float = 12.0
    max_deliveries: int = 5
    name: str = ""
    #: The shared budget's name (the job's: its spending persists in Redis across reruns).
    budget_name: str = ""
    #: Re-asks of an answer that does not match its request's schema (the job's ``--max-reasks``).
    max_reasks: int = MAX_REASKS

    def to_hash(self) -> dict[str, str]:
        return {
            "status": "running",
            "settings": json.dumps(
                {
                    "budget_usd": self.budget_usd,
                    "allow_unpriced": self.allow_unpriced,
                    "deployments": list(self.deployments),
                    "defaults": dict(self.defaults or {}),
                    "claim_after": self.claim_after,
                    "max_deliveries": self.max_deliveries,
                    "name": self.name,
                    "budget_name": self.budget_name,
                    "max_reasks": self.max_reasks,
                }
            ),
        }

    @classmethod
    def from_hash(cls, raw: Mapping[bytes, bytes]) -> JobSettings:
        data = json.loads(raw.get(b"settings", b"{}"))
        return cls(
            budget_usd=data.get("budget_usd"),
            allow_unpriced=bool(data.get("allow_unpriced")),
            deployments=tuple(data.get("deployments") or ()),
            defaults=data.get("defaults") or None,
            # Whoever writes these must not make workers steal each other's requests in
            # flight (every steal may send one again): the CLI's own floor, and at least one delivery.
            claim_after=max(MIN_CLAIM_AFTER, float(data.get("claim_after", 12.0))),
            max_deliveries=max(1, int(data.get("max_deliveries", 5))),
            name=str(data.get("name", "")),
            budget_name=str(data.get("budget_name", "")),
            max_reasks=max(0, int(data.get("max_reasks", MAX_REASKS))),
        )


@dataclass(frozen=True, slots=True)
class Delivery:
    """One request entry handed to this worker."""

    entry_id: str
    line: int
    fields: Mapping[bytes, bytes]
    #: How many times the entry has been delivered (1 on the first read).
    times: int = 1


def _fields(fields: Mapping[str, Any]) -> Any:
    return dict(fields)


def jobs_channel(namespace: str = "sluice") -> str:
    """Where a job announces itself when it is registered: waiting workers join at once."""
    return f"{namespace}:wake:jobs"


async def running_jobs(client: aioredis.Redis, namespace: str = "sluice") -> list[str]:
    members: Any = await client.smembers(f"{namespace}:jobs")
    return sorted(m.decode() for m in members)


class JobQueue:
    """The Redis operations of one job, for its coordinator and its workers."""

    def __init__(self, client: aioredis.Redis, job_id: str, namespace: str = "sluice") -> None:
        self.client = client
        self.job_id = job_id
        self.namespace = namespace
        base = f"{namespace}:job:{job_id}"
        self.registry = f"{namespace}:jobs"
        self.meta = base
        self.requests = f"{base}:requests"
        self.results = f"{base}:results"
        self.done = f"{base}:done"
        self.errors = f"{base}:errors"
        #: Set by the coordinator (expiring after ``ABANDONED_AFTER_S``) while it lives.
        self.coordinator = f"{base}:coordinator"
        self._touch = client.register_script(_TOUCH)
        self._abandon = client.register_script(_ABANDON)
        self._claim_cursor = "0-0"

    # -- the job ---------------------------------------------------------------------

    async def register(self, settings: JobSettings) -> None:
        """Create (or, on a rerun, refresh) the job and its groups; workers then join it."""
        for stream, group in ((self.requests, WORKERS_GROUP), (self.results, COORDINATOR_GROUP)):
            try:
                # From the start: entries fed before the group was made (Redis lost the job
                # meanwhile) are delivered too.
                await self.client.xgroup_create(stream, group, id="0", mkstream=True)
            except ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.hset(self.meta, mapping=_fields(settings.to_hash()))
            for key in (self.meta, self.requests, self.results, self.done, self.errors):
                pipe.persist(key)  # an abandoned job's keys were set to expire
            pipe.set(self.coordinator, "1", ex=ABANDONED_AFTER_S)
            pipe.sadd(self.registry, self.job_id)
            pipe.publish(jobs_channel(self.namespace), self.job_id)
            await pipe.execute()

    async def coordinator_beat(self) -> None:
        """The coordinator is alive (called every few seconds): the job is not abandoned."""
        await self.client.set(self.coordinator, "1", ex=ABANDONED_AFTER_S)

    async def abandon_if_orphaned(self) -> bool:
        """Take a running job whose coordinator is long gone off the running jobs; True if so."""
        keys = [self.coordinator, self.registry, self.meta, self.requests, self.results, self.done, self.errors]
        return bool(await self._abandon(keys=keys, args=[self.job_id, _ABANDONED_KEYS_TTL_S]))

    async def settings(self) -> JobSettings | None:
        """The job's settings; None once it is finished or gone."""
        raw: Any = await self.client.hgetall(self.meta)
        if not raw or raw.get(b"status") != b"running":
            return None
        return JobSettings.from_hash(raw)

    async def is_running(self) -> bool:
        return bool(await self.client.sismember(self.registry, self.job_id))

    async def status(self) -> str | None:
        """``running``, ``finished``, or None when Redis does not know the job (anymore)."""
        value: Any = await self.client.hget(self.meta, "status")
        return value.decode() if value else None

    async def finish(self) -> None:
        """Every line is written: workers leave, and the job's keys go."""
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.srem(self.registry, self.job_id)
            pipe.delete(self.requests, self.results, self.done, self.errors, self.coordinator)
            pipe.hset(self.meta, "status", "finished")
            pipe.expire(self.meta, _FINISHED_TTL_S)
            await pipe.execute()

    # -- the coordinator -------------------------------------------------------------

    async def outstanding(self) -> int:
        """Entries not yet answered (undelivered or in flight): the stream's length."""
        return int(await self.client.xlen(self.requests))

    async def feed(self, entries: Sequence[Mapping[str, str | int]]) -> None:
        async with self.client.pipeline(transaction=False) as pipe:
            for fields in entries:
                pipe.xadd(self.requests, _fields(fields))
            await pipe.execute()

    async def lines_in_redis(self) -> set[int]:
        """Lines whose request is queued or whose result waits (after a coordinator rerun:
        not to be fed again). Both streams are bounded by the feeding window."""
        lines: set[int] = set()
        for stream in (self.requests, self.results):  # this order: an answer moves from one to the other
            start = "-"
            while True:
                batch: Any = await self.client.xrange(stream, min=start, max="+", count=1000)
                for _entry_id, fields in batch:
                    lines.add(int(fields[b"line"]))
                if len(batch) < 1000:
                    break
                start = "(" + batch[-1][0].decode()
        return lines

    async def read_results(self, *, pending: bool, count: int, block_ms: int) -> list[tuple[str, dict[bytes, bytes]]]:
        """Results not yet written: first those a previous coordinator read but did not
        acknowledge (``pending``), then new ones."""
        reply: Any = await self.client.xreadgroup(
            COORDINATOR_GROUP,
            COORDINATOR,
            {self.results: "0" if pending else ">"},
            count=count,
            block=None if pending else block_ms,
        )
        out: list[tuple[str, dict[bytes, bytes]]] = []
        for _stream, entries in reply or ():
            for entry_id, fields in entries:
                if fields:  # an entry deleted while pending comes back empty
                    out.append((entry_id.decode(), fields))
        return out

    async def ack_results(self, entry_ids: Sequence[str], forget: Iterable[int] = ()) -> None:
        """Written: drop them from the results stream (and lines long written from done)."""
        forget = list(forget)
        async with self.client.pipeline(transaction=False) as pipe:
            if entry_ids:
                pipe.xack(self.results, COORDINATOR_GROUP, *entry_ids)
                pipe.xdel(self.results, *entry_ids)
            if forget:
                pipe.srem(self.done, *forget)
            await pipe.execute()

    # -- workers -----------------------------------------------------------------------

    async def fair_share(self) -> int:
        """What one worker may hold of this job: its unanswered entries over the workers
        that are up (a worker that takes more leaves the others idle)."""
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.xlen(self.requests)
            pipe.scard(f"{self.namespace}:workers")
            outstanding, workers = await pipe.execute()
        return -(-int(outstanding) // max(1, int(workers)))

    async def take(self, consumer: str, count: int, block_ms: int) -> list[Delivery]:
        reply: Any = await self.client.xreadgroup(
            WORKERS_GROUP, consumer, {self.requests: ">"}, count=count, block=block_ms
        )
        return [
            Delivery(entry_id.decode(), int(fields[b"line"]), fields)
            for _stream, entries in reply or ()
            for entry_id, fields in entries
        ]

    async def claim(self, consumer: str, count: int, min_idle_ms: int) -> list[Delivery]:
        """Entries idle that long (their holder stopped, or gave them back), now ours,
        each with how many times it has been delivered."""
        reply: Any = await self.client.xautoclaim(
            self.requests, WORKERS_GROUP, consumer, min_idle_ms, start_id=self._claim_cursor, count=count
        )
        cursor, entries = reply[0], reply[1]
        self._claim_cursor = cursor.decode() if isinstance(cursor, bytes) else str(cursor)
        claimed = [(entry_id.decode(), fields) for entry_id, fields in entries if fields]
        if not claimed:
            return []
        times: dict[str, int] = {}
        async with self.client.pipeline(transaction=False) as pipe:
            for entry_id, _ in claimed:
                pipe.xpending_range(self.requests, WORKERS_GROUP, entry_id, entry_id, 1, consumer)
            for rows in await pipe.execute():
                for row in rows:
                    mid = row["message_id"]
                    times[mid.decode() if isinstance(mid, bytes) else str(mid)] = int(row["times_delivered"])
        return [
            Delivery(entry_id, int(fields[b"line"]), fields, times.get(entry_id, 1)) for entry_id, fields in claimed
        ]

    async def is_done(self, line: int) -> bool:
        return bool(await self.client.sismember(self.done, str(line)))

    async def answer(self, delivery: Delivery, result: Mapping[str, str | int]) -> bool:
        """The answer (or dead letter) and the entry's end, in one transaction."""
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.xadd(self.results, _fields(result))
            pipe.sadd(self.done, delivery.line)
            pipe.xack(self.requests, WORKERS_GROUP, delivery.entry_id)
            pipe.xdel(self.requests, delivery.entry_id)
            pipe.hdel(self.errors, str(delivery.line))
            await pipe.execute()
        return True

    async def skip(self, delivery: Delivery) -> bool:
        """An entry already answered (by a worker that was thought dead): just end it."""
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.xack(self.requests, WORKERS_GROUP, delivery.entry_id)
            pipe.xdel(self.requests, delivery.entry_id)
            await pipe.execute()
        return True

    async def give_back(self, consumer: str, delivery: Delivery, error: Mapping[str, Any] | None) -> bool:
        """Not answered here: note why, and mark the entry idle so another worker claims it now."""
        async with self.client.pipeline(transaction=True) as pipe:
            if error is not None:
                pipe.hset(self.errors, str(delivery.line), json.dumps(error))
            pipe.xclaim(
                self.requests,
                WORKERS_GROUP,
                consumer,
                0,
                [delivery.entry_id],
                idle=_GIVEN_BACK_IDLE_MS,
                justid=True,
            )
            await pipe.execute()
        return True

    async def last_error(self, line: int) -> dict[str, Any] | None:
        raw = await self.client.hget(self.errors, str(line))
        return json.loads(raw) if raw else None

    async def touch(self, consumer: str, entry_ids: Sequence[str]) -> set[str]:
        """Keep this worker's entries from being claimed; the ids it no longer owns."""
        if not entry_ids:
            return set()
        lost = await self._touch(keys=[self.requests], args=[WORKERS_GROUP, consumer, *entry_ids])
        return {x.decode() if isinstance(x, bytes) else str(x) for x in lost}


class WorkerRegistry:
    """Heartbeats: ``{ns}:worker:{name}`` lives ``ttl`` seconds past its last refresh."""

    def __init__(self, client: aioredis.Redis, namespace: str = "sluice") -> None:
        self.client = client
        self.namespace = namespace
        self.names = f"{namespace}:workers"

    def _key(self, name: str) -> str:
        return f"{self.namespace}:worker:{name}"

    async def beat(self, name: str, concurrency: int, ttl: float) -> None:
        info = json.dumps({"concurrency": concurrency, "at": time.time()})
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.set(self._key(name), info, px=int(ttl * 1000))
            pipe.sadd(self.names, name)
            await pipe.execute()

    async def leave(self, name: str) -> None:
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.delete(self._key(name))
            pipe.srem(self.names, name)
            await pipe.execute()

    async def capacity(self) -> int:
        """Requests all live workers take at once (the dead are dropped from the set)."""
        members: Any = await self.client.smembers(self.names)
        names = sorted(n.decode() for n in members)
        if not names:
            return 0
        values = await self.client.mget([self._key(n) for n in names])
        total = 0
        gone: list[str] = []
        for name, value in zip(names, values, strict=True):
            if value is None:
                gone.append(name)
                continue
            try:
                total += int(json.loads(value).get("concurrency", 0))
            except (ValueError, AttributeError):
                continue
        if gone:
            await self.client.srem(self.names, *gone)
        return total
