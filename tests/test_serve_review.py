"""``sluice serve`` under attack: what a hostile client or a careless operator found broken."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import io
import json
import logging
import socket
import sys
import zlib
from pathlib import Path

import aiohttp
import openai
import pytest
from test_serve import ALICE_KEY, ENV, UPSTREAM_KEY, _cli_env, ask, deployment, embedder, fake, sdk, serving

from sluice.serve._clients import SpendStore
from sluice.serve._settings import ClientSpec

_BOUNDARY = "sluiceboundary"


async def _answer_to_trickle(url: str, head: bytes, first: bytes) -> bytes:
    """Send ``head`` and ``first``, then one byte every 50 ms (a slowloris body); what the
    server sent before closing (TimeoutError if it did not within 5 s)."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(head + first)
    await writer.drain()

    async def trickle() -> None:
        with contextlib.suppress(ConnectionError):
            for _ in range(600):
                writer.write(b" ")
                await writer.drain()
                await asyncio.sleep(0.05)

    sender = asyncio.create_task(trickle())
    try:
        async with asyncio.timeout(5.0):
            return await reader.read()
    finally:
        sender.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sender
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


@pytest.mark.parametrize(
    ("path", "content_type", "first"),
    [
        ("/v1/batches", "application/json", b"{"),
        ("/v1/files", f"multipart/form-data; boundary={_BOUNDARY}", f"--{_BOUNDARY}\r\n".encode()),
    ],
)
async def test_a_batch_or_file_body_sent_byte_by_byte_is_cut_off_with_a_408(
    tmp_path: Path, path: str, content_type: str, first: bytes
) -> None:
    """The Batch API's bodies were read without the body timeout: a trickling client held
    its connection and handler for as long as it liked."""
    async with fake() as upstream, serving([deployment(upstream)], tmp_path, body_timeout_s=0.5) as url:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: {content_type}\r\nContent-Length: 100000\r\n\r\n"
        ).encode()
        answer = await _answer_to_trickle(url, head, first)
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert b"did not arrive" in answer


async def test_a_json_nesting_bomb_for_a_batch_is_a_400_not_a_500(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with (
        fake() as upstream,
        serving([deployment(upstream)], tmp_path) as url,
        aiohttp.ClientSession() as http,
        http.post(f"{url}/v1/batches", data=b"[" * 100_000 + b"]" * 100_000) as got,
    ):
        assert got.status == 400
        assert "could not parse the JSON body" in (await got.json())["error"]["message"]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_a_client_that_hangs_up_mid_body_is_not_logged_as_an_internal_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with fake() as upstream, serving([deployment(upstream)], tmp_path) as url:
        host, port = url.removeprefix("http://").split(":")
        for path in ("/v1/batches", "/v1/files", "/v1/chat/completions"):
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(
                f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary={_BOUNDARY}\r\n"
                f"Content-Length: 100000\r\n\r\n--{_BOUNDARY}\r\n".encode()
            )
            await writer.drain()
            await asyncio.sleep(0.2)
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
            assert reader is not None
        await asyncio.sleep(0.3)
        async with aiohttp.ClientSession() as http, http.get(f"{url}/health") as got:
            assert got.status == 200
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [r.getMessage() for r in caplog.records]


async def _run_cli(*args: str, env: dict[str, str]) -> tuple[int | None, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sluice", "serve", *args,
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        async with asyncio.timeout(30):
            _, stderr = await process.communicate()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    return process.returncode, stderr.decode()


async def test_a_port_in_use_is_a_clear_error_not_a_traceback(tmp_path: Path) -> None:
    config = tmp_path / "sluice.toml"
    config.write_text('[[deployment]]\nmodel = "simulate/demo"\n')
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, stderr = await _run_cli(
            "--config", str(config), "--port", str(port), "--state", str(tmp_path / "state"), env=_cli_env()
        )
    assert code == 2, stderr
    assert f"cannot listen on 127.0.0.1:{port}" in stderr
    assert "Traceback" not in stderr


async def test_a_config_without_deployments_is_refused_at_startup(tmp_path: Path) -> None:
    config = tmp_path / "sluice.toml"
    config.write_text("[serve]\nmax_queue = 4\n")
    code, stderr = await _run_cli(
        "--config", str(config), "--port", "0", "--state", str(tmp_path / "s"), env=_cli_env()
    )
    assert code == 2, stderr
    assert "no [[deployment]]" in stderr


async def test_kill_9_mid_request_keeps_at_least_what_the_provider_bills_in_the_clients_spend(
    tmp_path: Path,
) -> None:
    """Client spend was written only when a request settled (or every 2 s): a kill -9 with
    requests in flight lost their cost, and the restarted server let the client spend it again."""
    async with fake(latency=3.0) as upstream:
        config = tmp_path / "sluice.toml"
        config.write_text(
            f"""
[[deployment]]
model = "openai/gpt-test"
base_url = "{upstream.url}"
api_key_env = "UPSTREAM_KEY"
price = {{ input_per_mtok = 2.0, output_per_mtok = 8.0 }}

[[client]]
name = "alice"
key_env = "ALICE_KEY"
budget_usd = 1.0
"""
        )
        state = tmp_path / "state"
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "sluice", "serve", "--config", str(config), "--port", "0", "--state", str(state),
            env=_cli_env(UPSTREAM_KEY=UPSTREAM_KEY, ALICE_KEY=ALICE_KEY),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            assert process.stdout is not None
            async with asyncio.timeout(30):
                line = (await process.stdout.readline()).decode()
            url = line.split("listening on ")[1].split()[0]
            async with aiohttp.ClientSession(headers={"authorization": f"Bearer {ALICE_KEY}"}) as http:
                sent = [
                    asyncio.create_task(
                        http.post(
                            f"{url}/v1/chat/completions",
                            json={"model": "gpt-test", "messages": ask(i), "max_tokens": 16},
                        )
                    )
                    for i in range(3)
                ]
                await upstream.until(lambda: upstream.in_flight == 3, timeout=10)
                process.kill()
                await process.wait()
                await asyncio.gather(*sent, return_exceptions=True)
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
            await process.communicate()
        await upstream.until(lambda: upstream.in_flight == 0, timeout=10)
    billed = upstream.total_billed_usd
    assert billed > 0
    spend = SpendStore(state / "clients.db")
    try:
        assert spend.load("alice") >= billed  # the worst case of those in flight, at least what was billed
    finally:
        spend.close()


async def test_a_clients_models_hold_for_its_batch_lines_too(tmp_path: Path) -> None:
    """The Batch API was mounted without the model check: a client limited to one model ran
    any other through a batch."""
    only_embeddings = ClientSpec("alice", "ALICE_KEY", models=("openai/text-embedding-3-small",))
    async with (
        fake() as upstream,
        serving([deployment(upstream), embedder(upstream)], tmp_path, clients=(only_embeddings,)) as url,
    ):
        client = sdk(url, ALICE_KEY)
        with pytest.raises(openai.NotFoundError):
            await client.chat.completions.create(model="gpt-test", messages=ask(0), max_tokens=4)
        lines = "".join(
            json.dumps(
                {
                    "custom_id": f"c{i}",
                    "method": "POST",
                    "url": "/v1/chat/completions",
                    "body": {"model": model, "messages": ask(i), "max_tokens": 4},
                }
            )
            + "\n"
            for i, model in enumerate(["gpt-test", "openai/gpt-test"])
        )
        upload = await client.files.create(file=("in.jsonl", io.BytesIO(lines.encode())), purpose="batch")
        batch = await client.batches.create(
            input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        async with asyncio.timeout(10):
            while batch.status not in ("completed", "failed", "cancelled"):
                await asyncio.sleep(0.05)
                batch = await client.batches.retrieve(batch.id)
        assert batch.request_counts is not None
        assert (batch.request_counts.completed, batch.request_counts.failed) == (0, 2)
        assert batch.error_file_id is not None
        errors = [json.loads(line) for line in (await client.files.content(batch.error_file_id)).text.splitlines()]
        assert {e["error"]["code"] for e in errors} == {"model_not_found"}
        assert upstream.stats.received == 0
        await client.close()


def _chat_lines(models: list[str]) -> bytes:
    return "".join(
        json.dumps(
            {
                "custom_id": f"c{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": model, "messages": ask(i), "max_tokens": 4},
            }
        )
        + "\n"
        for i, model in enumerate(models)
    ).encode()


async def test_a_clients_rpm_holds_for_its_batch_lines_too(tmp_path: Path) -> None:
    """A batch ran its lines past its client's rpm: the Batch API was a way around it."""
    limited = ClientSpec("alice", "ALICE_KEY", rpm=3)
    async with fake() as upstream, serving([deployment(upstream)], tmp_path, clients=(limited,)) as url:
        client = sdk(url, ALICE_KEY)
        upload = await client.files.create(
            file=("in.jsonl", io.BytesIO(_chat_lines(["gpt-test"] * 6))), purpose="batch"
        )
        batch = await client.batches.create(
            input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        await upstream.until(lambda: upstream.stats.accepted >= 3, timeout=10)
        await asyncio.sleep(0.5)  # room for more to go, were the rpm not held
        assert upstream.stats.received == 3
        batch = await client.batches.retrieve(batch.id)
        assert batch.status == "in_progress"
        assert batch.request_counts is not None
        assert batch.request_counts.completed == 3
        with pytest.raises(openai.RateLimitError):  # its interactive quota is spent as well
            await client.chat.completions.create(
                model="gpt-test", messages=ask(99), max_tokens=4, extra_headers={"x-sluice-max-wait": "0"}
            )
        await client.batches.cancel(batch.id)  # a line waiting for the quota stops waiting
        async with asyncio.timeout(5):
            while batch.status != "cancelled":
                await asyncio.sleep(0.05)
                batch = await client.batches.retrieve(batch.id)
        assert batch.request_counts is not None
        assert batch.request_counts.completed == 3
        assert batch.error_file_id is not None
        errors = [json.loads(line) for line in (await client.files.content(batch.error_file_id)).text.splitlines()]
        assert [e["error"]["code"] for e in errors] == ["batch_cancelled"] * 3
        assert upstream.stats.received == 3
        await client.close()


async def test_a_compressed_body_is_refused_not_inflated(tmp_path: Path) -> None:
    """aiohttp inflated a gzip body as it arrived: a 2 MB bomb cost ~200 MB of memory
    before the 413. No OpenAI SDK compresses its requests: a 415, the body never read."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    bomb = b"".join(packer.compress(b"\0" * (1 << 20)) for _ in range(64)) + packer.flush()
    small = gzip.compress(json.dumps({"model": "gpt-test", "messages": ask(0), "max_tokens": 4}).encode())
    async with fake() as upstream, serving([deployment(upstream)], tmp_path) as url, aiohttp.ClientSession() as http:
        for body in (bomb, small):
            headers = {"content-encoding": "gzip", "content-type": "application/json"}
            async with http.post(f"{url}/v1/chat/completions", data=body, headers=headers) as got:
                assert got.status == 415
                assert "uncompressed" in (await got.json())["error"]["message"]
        client = sdk(url)
        reply = await client.chat.completions.create(model="gpt-test", messages=ask(1), max_tokens=4)
        assert reply.choices[0].message.content == "echo: question 1"
        await client.close()
        assert upstream.stats.received == 1


assert ENV  # the keys test_serve's helpers read
