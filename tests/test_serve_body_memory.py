"""``sluice serve``'s memory against hostile bodies, measured for real: the server runs as a
command (a process of its own) and its peak RSS (``VmHWM``) is read from /proc.

A JSON body of tiny objects costs ~70 bytes of Python objects per 3 bytes sent: a 16 MB
``{"messages": [{}, {}, ...]}`` was parsed whole on the event loop before any check, and
several at once took gigabytes and stalled every other client.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from servetools import ALICE_KEY, BOB_KEY, ENV, UPSTREAM_KEY, ask, deployment, fake, serving

from sluice.serve.core._settings import ClientSpec

CAROL_KEY = "sk-carol-0123456789abcdef0"
MB = 1024 * 1024
ENV["CAROL_KEY"] = CAROL_KEY  # a third client for servetools.serving (it reads keys from ENV)
CLIENTS = tuple(ClientSpec(name, f"{name.upper()}_KEY") for name in ("alice", "bob", "carol"))
_NO_PROC = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads peak RSS from /proc")


def _status(pid: int, field: str) -> int:
    """A ``/proc/<pid>/status`` figure (``VmHWM``, ``VmRSS``) in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} in /proc/{pid}/status")


@contextlib.asynccontextmanager
async def served(tmp_path: Path, upstream_url: str, serve_table: str) -> AsyncIterator[tuple[str, int]]:
    """``sluice serve`` as a command, with alice, bob and carol; yields (url, pid)."""
    config = tmp_path / "sluice.toml"
    clients = "".join(
        f'\n[[client]]\nname = "{name}"\nkey_env = "{name.upper()}_KEY"\n' for name in ("alice", "bob", "carol")
    )
    config.write_text(
        f"""
[serve]
{serve_table}

[[deployment]]
model = "openai/gpt-test"
base_url = "{upstream_url}"
api_key_env = "UPSTREAM_KEY"
{clients}"""
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "ANTHROPIC_"))}
    env.update(UPSTREAM_KEY=UPSTREAM_KEY, ALICE_KEY=ALICE_KEY, BOB_KEY=BOB_KEY, CAROL_KEY=CAROL_KEY)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sluice", "serve", "--config", str(config), "--port", "0",
        "--state", str(tmp_path / "state"),
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        async with asyncio.timeout(60):
            line = (await process.stdout.readline()).decode()
        assert "listening on " in line, line
        yield line.split("listening on ")[1].split()[0], process.pid
    finally:
        if process.returncode is None:
            process.terminate()
        async with asyncio.timeout(60):
            await process.communicate()


def _tiny_objects(size: int) -> bytes:
    """A chat body of ``size`` bytes whose messages are empty objects."""
    head, tail = b'{"model":"gpt-test","messages":[', b"{}]}"
    return head + b"{}," * ((size - len(head) - len(tail)) // 3) + tail


async def _post(http: aiohttp.ClientSession, url: str, key: str, body: bytes) -> int:
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    async with http.post(f"{url}/v1/chat/completions", data=io.BytesIO(body), headers=headers) as response:
        await response.read()
        return response.status


@_NO_PROC
async def test_bodies_of_tiny_objects_cost_the_server_little_memory_and_stall_nobody(tmp_path: Path) -> None:
    """Before: four 16 MB bodies of ``{}`` were each parsed whole (~370 MB of objects
    apiece) before the 400; the server's peak RSS rose by well over 400 MB."""
    async with (
        fake() as upstream,
        served(tmp_path, upstream.url, "max_body_mb = 16") as (url, pid),
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http,
    ):
        body = {"model": "gpt-test", "messages": ask(0), "max_tokens": 4}
        headers = {"authorization": f"Bearer {CAROL_KEY}"}
        async with http.post(f"{url}/v1/chat/completions", json=body, headers=headers) as warm:
            assert warm.status == 200  # warm: the first request's imports are not the attack's
        before = _status(pid, "VmRSS")
        bomb = _tiny_objects(16 * MB)
        attacks = [asyncio.create_task(_post(http, url, key, bomb)) for key in (ALICE_KEY, BOB_KEY, ALICE_KEY, BOB_KEY)]
        victim = []
        for i in range(1, 4):  # carol's requests, while the attacks arrive
            async with http.post(
                f"{url}/v1/chat/completions", json={**body, "messages": ask(i)}, headers=headers
            ) as answered:
                victim.append(answered.status)
        statuses = await asyncio.gather(*attacks)
        peak = _status(pid, "VmHWM")
    assert victim == [200, 200, 200]
    assert set(statuses) <= {400, 413}, statuses
    assert peak - before < 200 * MB, f"peak RSS rose by {(peak - before) / MB:.0f} MB"


@_NO_PROC
async def test_a_message_batch_of_empty_requests_is_refused_without_being_parsed_whole(tmp_path: Path) -> None:
    """Before: the 48 MB body was read into memory and parsed whole (16 million dicts,
    over a gigabyte) before its first request was checked."""
    async with (
        fake() as upstream,
        served(tmp_path, upstream.url, "") as (url, pid),
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http,
    ):
        headers = {"x-api-key": ALICE_KEY, "anthropic-version": "2023-06-01", "content-type": "application/json"}
        async with http.get(f"{url}/v1/models", headers=headers) as warm:
            assert warm.status == 200
        before = _status(pid, "VmRSS")
        body = b'{"requests":[' + b"{}," * (16 * MB) + b"{}]}"
        async with http.post(f"{url}/v1/messages/batches", data=io.BytesIO(body), headers=headers) as refused:
            error = await refused.json()
        peak = _status(pid, "VmHWM")
        files = list((tmp_path / "state" / "files").iterdir())
    assert peak - before < 200 * MB, f"peak RSS rose by {(peak - before) / MB:.0f} MB"
    assert refused.status == 400
    assert error["error"]["message"] == "requests.0.custom_id: Field required"
    assert files == []  # neither the body nor a half-written requests file is left


async def test_a_body_of_too_many_values_is_a_413_that_says_so_and_a_large_plain_one_is_taken(tmp_path: Path) -> None:
    async with (
        fake() as upstream,
        serving([deployment(upstream)], tmp_path, clients=CLIENTS, max_body_mb=8, max_json_values=300_000) as url,
        aiohttp.ClientSession() as http,
    ):
        bomb = _tiny_objects(2 * MB)  # ~700,000 empty objects: more values than max_json_values
        headers = {"authorization": f"Bearer {ALICE_KEY}", "content-type": "application/json"}
        async with http.post(f"{url}/v1/chat/completions", data=io.BytesIO(bomb), headers=headers) as refused:
            error = (await refused.json())["error"]
        # 0.9 MB in one string, few values (aiohttp warns when the engine posts more than 1 MiB upstream)
        text = "lorem ipsum " * 75_000
        body = {"model": "gpt-test", "max_tokens": 4, "messages": [{"role": "user", "content": text}]}
        payload = io.BytesIO(json.dumps(body).encode())
        async with http.post(f"{url}/v1/chat/completions", data=payload, headers=headers) as taken:
            taken_status, taken_text = taken.status, await taken.text()
    assert refused.status == 413
    assert error["code"] == "too_many_values"
    assert "more than 300,000 JSON values" in error["message"]
    assert taken_status == 200, taken_text[:300]
    assert upstream.stats.received == 1


async def test_one_clients_large_bodies_wait_for_its_own_budget_not_another_clients(tmp_path: Path) -> None:
    """alice's slow 600 KB body holds her whole budget: her next large body waits (and is
    refused when the wait is up) while carol's large body and alice's small one go through."""
    async with (
        fake() as upstream,
        serving(
            [deployment(upstream)], tmp_path, clients=CLIENTS, client_parse_budget_mb=1, parse_budget_mb=8, max_wait_s=1
        ) as url,
    ):
        host, port = url.removeprefix("http://").split(":")
        _, writer = await asyncio.open_connection(host, int(port))
        big = {"model": "gpt-test", "max_tokens": 4, "messages": [{"role": "user", "content": "x" * 600_000}]}
        head = (
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ALICE_KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: 700000\r\n\r\n"
        )
        writer.write(head.encode() + b'{"model": ')  # and then nothing more for now: alice's budget is held
        await writer.drain()
        try:
            async with aiohttp.ClientSession() as http:

                async def post(key: str, body: dict[str, object]) -> tuple[int, str]:
                    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
                    payload = io.BytesIO(json.dumps(body).encode())
                    async with http.post(f"{url}/v1/chat/completions", data=payload, headers=headers) as response:
                        return response.status, (await response.text())

                await asyncio.sleep(0.2)  # the slow body is being read
                alice_big, carol_big, alice_small = await asyncio.gather(
                    post(ALICE_KEY, {**big, "messages": ask(1) + big["messages"]}),  # type: ignore[operator]
                    post(CAROL_KEY, big),
                    post(ALICE_KEY, {"model": "gpt-test", "max_tokens": 4, "messages": ask(2)}),
                )
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
    assert alice_big[0] == 429, alice_big
    assert "large request bodies of yours" in alice_big[1]
    assert carol_big[0] == 200, carol_big
    assert alice_small[0] == 200, alice_small
