"""``sluice serve``'s disk against hostile uploads: per-client quotas, expiry, the purposes
it uses, uploads under way and their deadline, and a disk that fills up (a real, tiny
tmpfs) leaving the state as it was."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from polling import until
from servetools import ALICE_KEY, BOB_KEY, deployment, fake, sdk, serving

from sluice.serve.core._settings import ClientSpec

CLIENTS = (ClientSpec("alice", "ALICE_KEY"), ClientSpec("bob", "BOB_KEY"))
KB = 1024


def _lines(size: int) -> bytes:
    """A batch file of about ``size`` bytes."""
    line = json.dumps({"custom_id": "x", "method": "POST", "url": "/v1/chat/completions", "body": {}}).encode()
    return (line + b"\n") * max(1, size // (len(line) + 1))


async def _upload(client: openai.AsyncOpenAI, data: bytes, **kwargs: Any) -> Any:
    return await client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch", **kwargs)


async def test_a_clients_files_stop_at_its_quota_of_bytes_and_of_files(tmp_path: Path) -> None:
    """Before: any number of uploads of any size were kept, for ever."""
    async with (
        fake() as upstream,
        serving([deployment(upstream)], tmp_path, clients=CLIENTS, client_files_mb=0.1, client_files=4) as url,
    ):
        alice, bob = sdk(url, key=ALICE_KEY), sdk(url, key=BOB_KEY)
        first = await _upload(alice, _lines(40 * KB))
        await _upload(alice, _lines(40 * KB))
        with pytest.raises(openai.BadRequestError) as over_bytes:
            await _upload(alice, _lines(40 * KB))  # 120 KB: past the 102 KB quota
        theirs = await _upload(bob, _lines(40 * KB))  # bob's quota is his own
        await _upload(alice, _lines(KB))
        await _upload(alice, _lines(KB))  # 4 files
        with pytest.raises(openai.BadRequestError) as over_files:
            await _upload(alice, _lines(KB))
        await alice.files.delete(first.id)
        again = await _upload(alice, _lines(40 * KB))  # room again
        listed = [f.id async for f in alice.files.list()]
        await alice.close()
        await bob.close()
    assert over_bytes.value.code == "quota_exceeded"
    assert "quota of 104,857 bytes" in str(over_bytes.value)
    assert "past their quota" in str(over_bytes.value)
    assert over_files.value.code == "quota_exceeded"
    assert "4 files" in str(over_files.value)
    assert theirs.id not in listed
    assert again.id in listed
    assert len(listed) == 4
    assert not [p for p in (tmp_path / "files").iterdir() if p.name.startswith(".upload")]


async def test_files_expire_as_they_say_and_a_purpose_the_server_does_not_use_is_refused(tmp_path: Path) -> None:
    """Before: ``expires_at`` was always null, nothing ever went, and any purpose was kept."""
    ttl_s = 3.0
    async with (
        fake() as upstream,
        serving([deployment(upstream)], tmp_path, clients=CLIENTS, file_ttl_days=ttl_s / 86400) as url,
    ):
        alice = sdk(url, key=ALICE_KEY)
        with pytest.raises(openai.BadRequestError) as vision:
            await alice.files.create(file=("a.png", io.BytesIO(b"\x89PNG")), purpose="vision")
        short = await _upload(alice, _lines(KB))
        asked = await _upload(alice, _lines(KB), expires_after={"anchor": "created_at", "seconds": 3600})

        async def swept() -> bool:
            return not [f.id async for f in alice.files.list()]

        await until(swept, timeout=60)
        with pytest.raises(openai.NotFoundError):
            await alice.files.content(short.id)
        await alice.close()
    assert "purpose 'batch'" in str(vision.value)
    assert short.expires_at == short.created_at + int(ttl_s)
    assert asked.expires_at == asked.created_at + int(ttl_s)  # the sooner of the two
    assert list((tmp_path / "files").iterdir()) == []


async def test_a_clients_uploads_under_way_are_capped_and_each_has_a_deadline(tmp_path: Path) -> None:
    """Two of alice's uploads trickle (fast enough for the progress check, never finishing):
    her third is a 429 at once, bob's goes through, and the two are cut at 3 s in all.
    Before: every upload was taken, and a trickle lasted as long as it kept up its pace."""
    async with (
        fake() as upstream,
        serving(
            [deployment(upstream)],
            tmp_path,
            clients=CLIENTS,
            client_uploads=2,
            upload_timeout_s=3,
            body_timeout_s=2,
        ) as url,
    ):
        host, port = url.removeprefix("http://").split(":")
        boundary = "sluice-test-boundary"
        head = (
            f"POST /v1/files HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ALICE_KEY}\r\n"
            f"Content-Type: multipart/form-data; boundary={boundary}\r\nContent-Length: 50000000\r\n\r\n"
            f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="in.jsonl"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n"
        ).encode()
        answers: list[bytes] = []

        async def trickle() -> None:
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(head)

            async def send() -> None:
                with contextlib.suppress(ConnectionError):
                    for _ in range(200):  # 40 s of 100 KB every 0.2 s, if nothing cuts it
                        writer.write(_lines(100 * KB))
                        await writer.drain()
                        await asyncio.sleep(0.2)

            sender = asyncio.create_task(send())
            try:
                async with asyncio.timeout(30):
                    answers.append(await reader.readuntil(b"\r\n\r\n") + await reader.read(4096))
            finally:
                sender.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sender
                writer.close()
                with contextlib.suppress(ConnectionError):
                    await writer.wait_closed()

        slow = [asyncio.create_task(trickle()) for _ in range(2)]
        alice, bob = sdk(url, key=ALICE_KEY), sdk(url, key=BOB_KEY)

        async def both_under_way() -> bool:
            return len(list((tmp_path / "files").glob(".upload-*"))) == 2

        await until(both_under_way, timeout=30)
        with pytest.raises(openai.RateLimitError) as third:
            await _upload(alice, _lines(KB))
        theirs = await _upload(bob, _lines(KB))
        await asyncio.gather(*slow)
        later = await _upload(alice, _lines(KB))  # her uploads are no longer under way
        await alice.close()
        await bob.close()
    assert "2 uploads of yours are under way" in str(third.value)
    assert theirs.bytes > 0
    assert later.bytes > 0
    assert [a.split(b"\r\n", 1)[0] for a in answers] == [b"HTTP/1.1 408 Request Timeout"] * 2
    assert all(b"did not arrive within 3 s" in a for a in answers)


# -- a full disk ---------------------------------------------------------------------------------


@contextlib.contextmanager
def _tiny_disk(path: Path, size: str) -> Any:
    """A tmpfs of ``size`` at ``path`` (skips the test where mounting is not permitted)."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.decode().strip() or done.returncode}): needs root")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def _consistent(state: Path) -> tuple[set[str], set[str]]:
    """(ids with a row, files on disk) in ``state``, read as a restart would."""
    import sqlite3

    with contextlib.closing(sqlite3.connect(state / "batches.db")) as db:
        rows = {row[0] for row in db.execute("SELECT id FROM files")}
    return rows, {p.name for p in (state / "files").iterdir()}


@pytest.mark.skipif(sys.platform != "linux" or os.geteuid() != 0, reason="mounts a tmpfs: Linux, as root")
async def test_a_full_disk_is_a_507_that_leaves_no_half_file_and_no_row_without_its_file(tmp_path: Path) -> None:
    """Before: a full disk mid-upload was a 500 (an unexpected error), and an upload whose
    record could not be written left its file behind with no row."""
    with _tiny_disk(tmp_path / "state", "2m") as state:
        async with (
            fake() as upstream,
            serving([deployment(upstream)], state, clients=CLIENTS) as url,
            aiohttp.ClientSession() as http,
        ):
            alice = sdk(url, key=ALICE_KEY)
            kept = await _upload(alice, _lines(10 * KB))
            with pytest.raises(openai.APIStatusError) as full:
                await _upload(alice, _lines(3 * 1024 * KB))
            headers = {"x-api-key": ALICE_KEY, "anthropic-version": "2023-06-01", "content-type": "application/json"}
            request = {"custom_id": "r", "params": {"model": "gpt-test", "max_tokens": 4, "messages": [
                {"role": "user", "content": "x" * 2000}]}}  # fmt: skip
            body = json.dumps({"requests": [{**request, "custom_id": f"r{i}"} for i in range(1500)]}).encode()
            async with http.post(f"{url}/v1/messages/batches", data=io.BytesIO(body), headers=headers) as batch:
                batch_status, batch_error = batch.status, await batch.json()
            # a disk all but full: the file fits, the record of it may not
            free = os.statvfs(state)
            filler = state / "filler"
            filler.write_bytes(b"\0" * max(0, free.f_bavail * free.f_frsize - 24 * KB))
            statuses = []
            for size in (4 * KB, 8 * KB, 12 * KB, 16 * KB):
                try:
                    statuses.append((await _upload(alice, _lines(size))).id)
                except openai.APIStatusError as exc:
                    statuses.append(exc.status_code)
            rows, on_disk = _consistent(state)
            filler.unlink()
            after = await _upload(alice, _lines(10 * KB))  # room again: the server works on
            content = await alice.files.content(kept.id)
            await alice.close()
    assert full.value.status_code == 507
    assert "no room left" in str(full.value)
    assert batch_status == 507, batch_error
    assert all(s == 507 or isinstance(s, str) for s in statuses), statuses
    assert rows == on_disk  # every row has its file, every file its row, no half-written upload
    assert kept.id in rows
    assert after.bytes > 0
    assert content.content == _lines(10 * KB)


# -- count_requests ---------------------------------------------------------------------------


def test_counting_a_one_line_file_of_60_mb_reads_it_a_piece_at_a_time(tmp_path: Path) -> None:
    """Before: ``for raw in f`` held the whole 60 MB line (the peak was over 60 MB)."""
    path = tmp_path / "one-line.jsonl"
    with path.open("wb") as f:
        f.write(b"\xef\xbb\xbf  \n\n")
        f.write(b'{"custom_id": "' + b"x" * (60 * 1024 * KB) + b'"}')  # no newline at the end
    code = (
        "import sys, tracemalloc; from pathlib import Path; from sluice.serve.files._files import count_requests;"
        "tracemalloc.start(); n = count_requests(Path(sys.argv[1])); print(n, tracemalloc.get_traced_memory()[1])"
    )
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    count, peak = map(int, done.stdout.split())
    assert count == 1
    assert peak < 8 * 1024 * KB, f"peak {peak / 1024 / KB:.1f} MB"


def test_the_new_serve_settings_are_checked_with_the_file_named() -> None:
    from sluice._errors import ConfigError
    from sluice.serve.core._settings import serve_tables

    settings, _ = serve_tables({"serve": {"client_uploads": 2, "file_ttl_days": 0, "max_json_values": 10}}, "s.toml")
    assert (settings.client_uploads, settings.file_ttl_days, settings.max_json_values) == (2, 0, 10)
    for bad in ({"client_uploads": 0}, {"client_files_mb": -1}, {"upload_timeout_s": "long"}, {"max_json_values": 1.5}):
        with pytest.raises(ConfigError, match=rf"s\.toml: \[serve\] {next(iter(bad))} must be"):
            serve_tables({"serve": bad}, "s.toml")
