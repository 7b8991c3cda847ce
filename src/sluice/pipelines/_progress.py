"""A pipeline job seen from any machine that reaches its Redis: ``sluice report --redis URL
--job NAME``.

While it runs: the answers by kind and their dollars (the counters of :mod:`._store`), the
shared budget (spent, held, left), and each live worker's note (rows in flight, attempts,
429s). The plotted report (``--html``, ``--json``) is the one a local job gets: the job's
answers are copied into a temporary state file, which the report reads as it reads an
older state, from its results (one point per row at its last attempt; workers keep no
timeline, as a ``--redis`` job's do not).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
from pathlib import Path
from typing import Any

from .._errors import ConfigError
from .._format import usd
from .._records import result_from_record
from ._store import job_keys

__all__ = ["job_progress", "progress_rows", "read_progress", "snapshot_state"]

#: A worker not heard from for this long is gone.
_GONE_AFTER_S = 5.0


async def job_progress(url: str, job: str, namespace: str = "sluice") -> dict[str, Any]:
    """The job's figures as Redis has them now."""
    from ..redis import Connection

    keys = job_keys(namespace, job)
    connection = Connection(url, namespace=namespace)
    client = connection.client
    try:
        meta_raw, workers_raw, stored = await connection.call(_read_all(client, keys))
        budget = await _budget(client, namespace, job)
    finally:
        await connection.close()
    meta = {k.decode(): v.decode() for k, v in meta_raw.items()}
    if not meta and not stored:
        raise ConfigError(f"no pipeline job {job!r} in Redis at {connection.target} (namespace {namespace!r})")
    kinds = {k[2:]: int(v) for k, v in meta.items() if k.startswith("n:") and int(v)}
    now = time.time()
    workers = []
    for name, value in workers_raw.items():
        note = json.loads(value)
        note["name"] = name.decode()
        note["alive"] = now - float(note.get("at", 0)) < _GONE_AFTER_S
        workers.append(note)
    return {
        "job": job,
        "answered": kinds.get("ok", 0),
        "failed": {k: n for k, n in sorted(kinds.items()) if k != "ok"},
        "stored": int(stored),
        "writes": int(meta.get("puts", 0)),
        "cost_usd": int(meta.get("cost_micro", 0)) / 1_000_000,
        "started_at": float(meta["started_at"]) if "started_at" in meta else None,
        "updated_at": float(meta["updated_at"]) if "updated_at" in meta else None,
        "budget": budget,
        "workers": sorted(workers, key=lambda w: w["name"]),
    }


async def _read_all(client: Any, keys: dict[str, str]) -> tuple[Any, Any, Any]:
    async with client.pipeline(transaction=False) as pipe:
        pipe.hgetall(keys["meta"])
        pipe.hgetall(keys["workers"])
        pipe.hlen(keys["results"])
        meta, workers, stored = await pipe.execute()
    return meta, workers, stored


async def _budget(client: Any, namespace: str, job: str) -> dict[str, float] | None:
    """The shared budget's totals (``RedisBudget``'s keys), read without taking part in it."""
    raw: Any = await client.hgetall(f"{namespace}:budget:{{rows:{job}}}:totals")
    if not raw:
        return None
    values = {k.decode(): int(v) / 1_000_000 for k, v in raw.items() if v.lstrip(b"-").isdigit()}
    return {
        "limit": values.get("limit", 0.0),
        "spent": values.get("spent", 0.0),
        "reserved": values.get("reserved", 0.0),
    }


def _when(timestamp: float | None) -> str:
    if timestamp is None:
        return "-"
    return dt.datetime.fromtimestamp(timestamp, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def progress_rows(progress: dict[str, Any]) -> list[tuple[str, str]]:
    """The figures as the rows of ``sluice report``'s table."""
    alive = [w for w in progress["workers"] if w["alive"]]
    failed = progress["failed"]
    rows = [
        ("job", progress["job"]),
        ("status", f"running ({len(alive)} workers)" if alive else "no worker running"),
        ("started", _when(progress["started_at"])),
        ("last answer", _when(progress["updated_at"])),
        ("rows answered", f"{progress['answered']:,}"),
        ("rows failed", f"{sum(failed.values()):,}"),
    ]
    rows += [(f"  {kind}", f"{n:,}") for kind, n in failed.items()]
    rows.append(("answers stored", f"{progress['stored']:,} ({progress['writes']:,} writes)"))
    rows.append(("cost of the answers", usd(progress["cost_usd"])))
    budget = progress["budget"]
    if budget is not None:
        left = budget["limit"] - budget["spent"] - budget["reserved"]
        rows.append(
            (
                "budget",
                f"{usd(budget['spent'])} spent, {usd(budget['reserved'])} held, "
                f"{usd(max(0.0, left))} left of {usd(budget['limit'])}",
            )
        )
    if alive:
        rows.append(("in flight", f"{sum(int(w['in_flight']) for w in alive):,} rows"))
    for w in progress["workers"]:
        state = "" if w["alive"] else " (gone)"
        rows.append(
            (
                f"worker {w['host']}:{w['pid']}{state}",
                f"{w['in_flight']} in flight, {w['rows']:,} rows, {w['attempts']:,} attempts, "
                f"{w['rate_limited']:,} 429s",
            )
        )
    return rows


async def _copy_answers(url: str, job: str, namespace: str, path: Path) -> int:
    """Every stored answer of the job into a new state file at ``path``; how many."""
    from ..redis import Connection
    from ..store import SqliteStore

    connection = Connection(url, namespace=namespace)
    store = SqliteStore(path)
    copied = 0
    try:
        cursor = 0
        results = job_keys(namespace, job)["results"]
        while True:
            cursor, chunk = await connection.call(connection.client.hscan(results, cursor, count=1000))
            for field, value in chunk.items():
                kind, _, body = value.partition(b"\t")
                if b"\x00" in body:  # an embedding's: the report counts chat answers
                    continue
                record = json.loads(body)
                result = result_from_record(None, record)
                cost = float(record.get("cost_usd") or 0.0)
                intent = await store.begin(field.decode(), cost)
                await store.put_at(field.decode(), result, float(record.get("at") or time.time()))
                store.settle(intent, cost, answered=kind == b"ok")
                copied += 1
            if cursor == 0:
                break
        store.set_meta(status="finished", input=f"redis job {job}", total=copied, started_at=None, pid=None)
    finally:
        store.close()
        await connection.close()
    return copied


def read_progress(url: str, job: str, namespace: str = "sluice") -> dict[str, Any]:
    """:func:`job_progress`, from sync code."""
    return asyncio.run(job_progress(url, job, namespace))


def snapshot_state(url: str, job: str, path: Path, namespace: str = "sluice") -> int:
    """A state file at ``path`` holding the job's answers, for the plotted report."""
    return asyncio.run(_copy_answers(url, job, namespace, path))
