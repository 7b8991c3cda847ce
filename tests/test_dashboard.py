"""``/dashboard`` on ``sluice serve``: who may look, what the JSON says, and the page in a
real browser (headless Chromium) in front of the fake provider."""

from __future__ import annotations

import asyncio
import contextlib
import html
import io
import json
import os
import re
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest
from browser_dash import browse
from fake_provider import deployment_at
from polling import until
from servetools import ALICE_KEY, BOB_KEY, ENV, PRICE, UPSTREAM_KEY, ask, deployment, fake, listening, sdk

from sluice import CallableProvider, ConfigError, Deployment, Request, RetryPolicy, ServerError
from sluice.cli._config import JobConfig
from sluice.serve._app import build_app
from sluice.serve.core._settings import ClientSpec, ServeSettings, serve_tables
from sluice.serve.dashboard._backoff import CAP, FORGET, FREE, Backoff
from sluice.serve.dashboard._dashboard import BACKOFF, LIVE, SESSION_S, DashboardAuth
from sluice.serve.dashboard._live import Live
from sluice.testing import FakeServer

ADMIN_KEY = "sk-admin-0123456789abcdef"
#: Making a session needs only the key (the clients are asked only when checking one).
CLIENTS_NONE: Any = None
HOSTILE = '<img src=x onerror="window.__pwned=1">'
CLIENTS = (
    ClientSpec("alice", "ALICE_KEY", budget_usd=1.0, rpm=600),
    ClientSpec("bob", "BOB_KEY", models=("openai/gpt-test",)),
)


@contextlib.asynccontextmanager
async def dashboard_server(
    deployments: list[Deployment],
    state: Path,
    *,
    clients: tuple[ClientSpec, ...] = CLIENTS,
    admin: bool = True,
    env: dict[str, str] | None = None,
    **settings: Any,
) -> AsyncIterator[str]:
    """``sluice serve`` in-process on a loopback port, with an admin key (``$ADMIN_KEY``)."""
    if admin:
        settings.setdefault("admin_key_env", "ADMIN_KEY")
    config = JobConfig(tuple(deployments), retry=RetryPolicy(max_attempts=3, base_delay=0.01, max_delay=0.02))
    env = {**ENV, "ADMIN_KEY": ADMIN_KEY, **(env or {})}
    async with listening(build_app(config, ServeSettings(**settings), clients, state, environ=env)) as url:
        yield url


async def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, Mapping[str, str], str]:
    """Status, headers (any case) and body of a GET."""
    async with aiohttp.ClientSession() as http, http.get(url, headers=headers or {}, allow_redirects=False) as r:
        return r.status, r.headers.copy(), await r.text()


def _bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


# -- who may look ----------------------------------------------------------------------------------


async def test_the_dashboard_answers_401_without_the_admin_key_and_403_to_a_client(tmp_path: Path) -> None:
    async with fake() as upstream, dashboard_server([deployment(upstream)], tmp_path / "state") as url:
        for path in ("/dashboard", "/dashboard/data"):
            status, headers, body = await _get(url + path)
            assert status == 401, body
            assert headers["cache-control"] == "no-store"
            assert ADMIN_KEY not in body
            status, _, body = await _get(url + path, _bearer("sk-not-the-admin-key-at-all"))
            assert status == 401, body
            for client_key in (ALICE_KEY, BOB_KEY):
                status, _, body = await _get(url + path, _bearer(client_key))
                assert status == 403, body
                assert "client's key" in html.unescape(body)
        status, headers, body = await _get(url + "/dashboard")
        assert 'name="key"' in body  # a browser gets the login form
        assert headers["www-authenticate"] == 'Bearer realm="sluice dashboard"'
        status, headers, page = await _get(url + "/dashboard", _bearer(ADMIN_KEY))
        assert status == 200
        assert headers["content-type"].startswith("text/html")
        policy = headers["content-security-policy"]
        assert "default-src 'none'" in policy
        assert "connect-src 'self'" in policy
        assert "unsafe-inline" not in policy
        assert "frame-ancestors 'none'" in policy
        assert ADMIN_KEY not in page
        assert "http://" not in page.replace("http://www.w3.org/2000/svg", "")  # nothing loaded from anywhere
        assert "<script src" not in page
        assert "<link" not in page
        status, _, data = await _get(url + "/dashboard/data", _bearer(ADMIN_KEY))
        assert status == 200
        assert ADMIN_KEY not in data
        # a client's key still works where it belongs, and the admin key is not a client's
        status, _, _ = await _get(url + "/v1/models", _bearer(ALICE_KEY))
        assert status == 200
        status, _, _ = await _get(url + "/v1/models", _bearer(ADMIN_KEY))
        assert status == 401


async def test_a_browser_logs_in_with_a_form_and_gets_a_session_cookie(tmp_path: Path) -> None:
    async with fake() as upstream, dashboard_server([deployment(upstream)], tmp_path / "state") as url:
        jar = aiohttp.CookieJar(unsafe=True)  # cookies for 127.0.0.1
        async with aiohttp.ClientSession(cookie_jar=jar) as http:
            for key, status in ((ALICE_KEY, 403), ("wrong-key-0123456789", 401), ("", 401)):
                async with http.post(url + "/dashboard/login", data={"key": key}, allow_redirects=False) as r:
                    assert r.status == status
                    assert "set-cookie" not in r.headers
            async with http.post(url + "/dashboard/login", data={"key": ADMIN_KEY}, allow_redirects=False) as r:
                assert r.status == 303
                assert r.headers["location"] == "/dashboard"
                cookie = r.headers["set-cookie"]
            assert "HttpOnly" in cookie
            assert "SameSite=Strict" in cookie
            assert "Path=/dashboard" in cookie
            assert ADMIN_KEY not in cookie
            async with http.get(url + "/dashboard/data") as r:
                assert r.status == 200
                assert "deployments" in await r.json()
            (morsel,) = [m for m in jar if m.key == "sluice_dashboard"]
            value = morsel.value
        expired = DashboardAuth(ADMIN_KEY, CLIENTS_NONE).session(now=time.time() - SESSION_S - 1)  # signed, too old
        for forged in (value[:-2] + "xx", value.replace(value.split(".")[0], "9999999999", 1), "1.2.3", expired):
            status, _, _ = await _get(url + "/dashboard/data", {"cookie": f"sluice_dashboard={forged}"})
            assert status == 401
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
            http.cookie_jar.update_cookies({"sluice_dashboard": value})
            async with http.post(url + "/dashboard/logout", allow_redirects=False) as r:
                assert r.status == 303
                assert "Max-Age=0" in r.headers["set-cookie"]


async def test_without_an_admin_key_the_dashboard_is_off_with_clients_and_loopback_only_without(
    tmp_path: Path,
) -> None:
    async with fake() as upstream:
        async with dashboard_server([deployment(upstream)], tmp_path / "a", admin=False) as url:
            for path in ("/dashboard", "/dashboard/data"):
                status, _, body = await _get(url + path, _bearer(ALICE_KEY))
                assert status == 404
                assert "admin_key_env" in body
        async with dashboard_server([deployment(upstream)], tmp_path / "b", clients=(), admin=False) as url:
            status, _, body = await _get(url + "/dashboard/data")  # from 127.0.0.1: this machine
            assert status == 200, body


def test_the_admin_key_setting_is_checked(tmp_path: Path) -> None:
    upstream_deployment = Deployment("openai/gpt-test", base_url="http://127.0.0.1:9/v1", api_key="sk-x")
    config = JobConfig((upstream_deployment,))

    def build(env: dict[str, str], clients: tuple[ClientSpec, ...] = CLIENTS) -> None:
        build_app(config, ServeSettings(admin_key_env="ADMIN_KEY"), clients, tmp_path / "s", environ=env)

    with pytest.raises(ConfigError, match=r"admin key variable \$ADMIN_KEY is not set"):
        build(dict(ENV))
    with pytest.raises(ConfigError, match="shorter than 16"):
        build({**ENV, "ADMIN_KEY": "short"})
    with pytest.raises(ConfigError, match="is a client's key"):
        build({**ENV, "ADMIN_KEY": ALICE_KEY})
    for bad in ("sk-admin-0123456789abcdef", "", 3, "$ADMIN"):
        with pytest.raises(ConfigError, match="must name the environment variable"):
            serve_tables({"serve": {"admin_key_env": bad}}, "sluice.toml")
    settings, _ = serve_tables({"serve": {"admin_key_env": "SLUICE_ADMIN_KEY"}}, "sluice.toml")
    assert settings.admin_key_env == "SLUICE_ADMIN_KEY"


# -- what it shows ---------------------------------------------------------------------------------


async def _hostile_upstream(request: Request) -> str:
    raise ServerError(f"upstream says {HOSTILE}", status=503)


async def test_the_data_says_what_the_server_is_doing(tmp_path: Path) -> None:
    async with fake(rpm=6000) as upstream:
        deployments = [deployment(upstream, rpm=600, tpm=100_000, max_in_flight=8)]
        async with dashboard_server(deployments, tmp_path / "state") as url:
            alice, bob = sdk(url, key=ALICE_KEY), sdk(url, key=BOB_KEY)
            upstream.inject("503")
            for i in range(3):
                await alice.chat.completions.create(model="gpt-test", messages=ask(i), max_tokens=8)
            await bob.chat.completions.create(model="gpt-test", messages=ask(9), max_tokens=8)
            with contextlib.suppress(Exception):
                await bob.chat.completions.create(model=HOSTILE, messages=ask(10))
            await alice.close()
            await bob.close()
            status, _, text = await _get(url + "/dashboard/data", _bearer(ADMIN_KEY))
    assert status == 200
    for secret in (ADMIN_KEY, ALICE_KEY, BOB_KEY, UPSTREAM_KEY, upstream.url, f"127.0.0.1:{upstream.port}"):
        assert secret not in text
    data = json.loads(text)
    (d,) = data["deployments"]
    assert d["name"] == "openai/gpt-test"
    assert d["configured"] == {"rpm": 600.0, "tpm": 100000.0, "itpm": None, "otpm": None, "max_in_flight": 8}
    assert d["answered"] == 4
    assert d["state"] == "ok"
    cache = data["prompt_cache"]  # short prompts: every token uncached, as the upstream billed them
    assert cache["uncached_tokens"] == d_input_tokens(data) > 0
    assert (cache["read_tokens"], cache["written_tokens"], cache["duplicate_writes"]) == (0, 0, 0)
    clients = {c["name"]: c for c in data["clients"]}
    assert set(clients) == {"alice", "bob"}
    assert clients["alice"]["budget_usd"] == 1.0
    assert 0 < clients["alice"]["spent_usd"] < 1.0
    assert clients["alice"]["requests"] == 3
    assert clients["alice"]["rpm"] == 600
    assert clients["bob"]["requests"] == 1
    assert clients["bob"]["budget_usd"] is None
    assert clients["bob"]["models"] == ["openai/gpt-test"]
    assert data["totals"]["succeeded"] == 4
    assert data["totals"]["retries"] == 1
    kinds = {(e["source"], e["kind"]) for e in data["errors"]}
    assert ("upstream", "server_error") in kinds
    assert ("client", "model_not_found") in kinds
    (refusal,) = [e for e in data["errors"] if e["kind"] == "model_not_found"]
    assert refusal["client"] == "bob"
    assert refusal["status"] == 404
    assert HOSTILE in refusal["message"]  # kept as it came: the page shows it as text
    assert data["queue"]["max_queue"] == 256
    assert data["server"]["status"] == "ok"
    assert data["series"]["t"]  # sampled at start and when asked
    assert len(data["series"]["t"]) == len(data["series"]["answered_per_s"])


# -- in a real browser -----------------------------------------------------------------------------


async def _traffic(url: str, upstream: FakeServer, stop: asyncio.Event) -> None:
    """Clients at work until ``stop``: alice and bob chatting, some 503s and 429s, a batch."""
    alice, bob = sdk(url, key=ALICE_KEY), sdk(url, key=BOB_KEY)
    try:
        lines = "".join(
            json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
                        "body": {"model": "gpt-test", "messages": ask(100 + i), "max_tokens": 8}}) + "\n"
            for i in range(20)
        )  # fmt: skip
        uploaded = await alice.files.create(file=("b.jsonl", io.BytesIO(lines.encode())), purpose="batch")
        await alice.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
        i = 0
        while not stop.is_set():
            if i % 7 == 3:
                upstream.inject("503")
            if i % 11 == 5:
                upstream.inject("429", retry_after=0.05)
            client = alice if i % 2 else bob
            with contextlib.suppress(Exception):
                await client.chat.completions.create(model="gpt-test", messages=ask(1000 + i), max_tokens=8)
            i += 1
            await asyncio.sleep(0.05)
    finally:
        await alice.close()
        await bob.close()


async def test_the_dashboard_renders_live_data_in_headless_chromium(tmp_path: Path) -> None:
    hostile_key = "sk-hostile-0123456789abcdef"
    hostile = Deployment("openai/hostile", name="hostile", provider=CallableProvider(_hostile_upstream))
    clients = (*CLIENTS, ClientSpec(HOSTILE, "HOSTILE_KEY"))
    async with browse() as browser, fake(latency=0.05) as upstream:
        deployments = [deployment(upstream, rpm=1200, name="east"), hostile]
        async with dashboard_server(
            deployments, tmp_path / "s", clients=clients, env={"HOSTILE_KEY": hostile_key}
        ) as url:
            # the hostile provider's error (retried, then failed) goes into the recent errors
            async with aiohttp.ClientSession(headers=_bearer(hostile_key)) as http:
                body = {"model": "hostile", "messages": ask(1), "max_tokens": 8}
                async with http.post(url + "/v1/chat/completions", json=body) as r:
                    assert r.status == 503
            async with aiohttp.ClientSession() as http, http.get(url + "/v1/models", headers=_bearer("sk-wrong")) as r:
                assert r.status == 401  # counted above the errors, not one of them
            async with aiohttp.ClientSession() as http:  # a model name with a bidi override, in an error
                assert (await _chat_status(http, url, BOB_KEY, f"gpt-{RLO}tset"))[0] == 404
            stop = asyncio.Event()
            traffic = asyncio.create_task(_traffic(url, upstream, stop))
            try:
                await upstream.until(lambda: upstream.stats.received >= 10, timeout=30)
                visit = await browser.visit(url + "/dashboard")
                assert await visit.count("input[name=key]") == 1  # the login form (a 401)
                assert visit.console_errors == [
                    "Failed to load resource: the server responded with a status of 401 (Unauthorized)"
                ]
                visit.console_errors.clear()  # the browser's word on the 401 itself: not a script error
                await visit.page.fill("input[name=key]", ADMIN_KEY)
                await visit.page.click("button[type=submit]")
                await visit.wait_for("Number(document.getElementById('updated')?.dataset.polls) >= 1")
                first = await visit.texts("#answered")
                await visit.wait_for("Number(document.getElementById('updated')?.dataset.polls) >= 3")
                await visit.wait_for("document.querySelectorAll('#chart-requests polyline').length > 0")
                later = await visit.texts("#answered")
                await _check_page(visit)
                png = os.environ.get("SLUICE_DASHBOARD_PNG")
                if png:  # the README's screenshot: SLUICE_DASHBOARD_PNG=docs/dashboard.png pytest -k chromium
                    await visit.screenshot(Path(png), full_page=True)
            finally:
                stop.set()
                await traffic
    assert int(later[0].replace(",", "")) > int(first[0].replace(",", "")), (first, later)  # live: it moved
    assert visit.console_errors == []
    assert visit.page_errors == []
    own = {url + p for p in ("/dashboard", "/dashboard/login", "/dashboard/data")}
    assert set(visit.requested) <= own, set(visit.requested) - own  # nothing from anywhere else


def d_input_tokens(data: Any) -> int:
    """The input tokens the dashboard's totals say the answers took."""
    return int(data["totals"]["input_tokens"])


async def _check_page(visit: Any) -> None:
    """Every table and chart holds the server's data; nothing hostile became markup."""
    (cache,) = await visit.texts("#prompt-cache")
    assert all(word in cache for word in ("read", "written", "uncached", "saved")), cache
    deployments = await visit.texts("#deployments tbody tr")
    assert len(deployments) == 2
    assert any("east" in row for row in deployments)
    assert any("hostile" in row for row in deployments)
    clients = await visit.texts("#clients tbody tr td:first-child")
    assert sorted(clients) == sorted(["alice", "bob", HOSTILE])  # the name, as text
    assert await visit.count("#clients .bar") >= 1  # alice's budget
    batches = await visit.texts("#batches tbody tr")
    assert len(batches) == 1
    assert "alice" in batches[0]
    errors = await visit.texts("#errors tbody tr")
    assert any("upstream says " + HOSTILE in row for row in errors)
    assert any("server_error" in row for row in errors)
    assert any("The model `gpt-tset` does not exist" in row for row in errors)  # read as the server wrote it
    assert not any(RLO in row for row in errors)
    for chart in ("requests", "tokens", "load", "spend"):
        points = await visit.attribute(f"#chart-{chart} polyline", "points")
        assert points is not None, chart
        assert points.count(",") >= 2, (chart, points)
    queue = await visit.texts("#queue dd")
    assert len(queue) == 3
    assert await visit.page.evaluate("window.__pwned") is None
    assert await visit.count("img") == 0  # the hostile markup stayed text
    assert (await visit.texts("#status"))[0].startswith("ok")
    (strangers,) = await visit.texts("#unauthenticated")
    assert strangers.startswith("1 request refused for a wrong or missing key"), strangers
    isolated = "getComputedStyle(document.querySelector('%s')).unicodeBidi"
    for cell in ("#clients tbody td b", "#errors tbody td.why bdi", "#deployments tbody .why bdi"):
        assert await visit.page.evaluate(isolated % cell) == "isolate", cell
    await _check_axes(visit)


async def _check_axes(visit: Any) -> None:
    """Issue 34, point 28: each chart has a y axis (several labels, from 0 to a round value
    within twice its data's top, so a small series has height) and a time axis; money
    labels share one format."""
    for chart in ("requests", "tokens", "load", "spend"):
        y_labels = await visit.texts(f"#chart-{chart} text.y-label")
        x_labels = await visit.texts(f"#chart-{chart} text.x-label")
        assert len(y_labels) >= 3, (chart, y_labels)
        assert y_labels[0] in ("0", "$0.00", "$0.000", "$0.0000"), (chart, y_labels)
        assert len(x_labels) >= 2, (chart, x_labels)
        assert all(re.fullmatch(r"\d\d:\d\d(:\d\d)?", label) for label in x_labels), (chart, x_labels)
        top = float(await visit.attribute(f"#chart-{chart} svg", "data-data-max") or "nan")
        y_max = float(await visit.attribute(f"#chart-{chart} svg", "data-y-max") or "nan")
        assert top <= y_max, chart
        if top > 0:
            assert y_max <= 2 * top, (chart, top, y_max)
    money = await visit.texts("#chart-spend text.y-label")
    assert all(re.fullmatch(r"\$\d[\d,]*\.\d+", label) for label in money), money
    assert len({len(label.split(".")[1]) for label in money}) == 1, money


def test_a_polls_last_point_is_a_rate_over_a_whole_tick() -> None:
    """A poll moments after a tick adds a point a few hundredths of a second on: its rates
    are measured over the tick before too, not over that sliver (1 answer in 0.05 s would
    plot as 20/s where the server answers 10/s)."""
    from types import SimpleNamespace

    def sample(at: float, answered: int) -> Any:
        return SimpleNamespace(
            **{"at": at, "succeeded": answered, "failed": 0, "rate_limited": 0, "retries": 0},
            **{"tokens": answered * 100, "spent": 0.0, "in_flight": 3, "waiting": 0, "requests": {}},
        )

    series = Live._series([sample(0.0, 0), sample(2.0, 20), sample(4.0, 40), sample(4.05, 41)])
    assert series["t"] == [2.0, 4.0, 4.05]
    assert series["answered_per_s"][:2] == [10.0, 10.0]
    assert 9.5 <= series["answered_per_s"][2] <= 10.5, series
    assert 57_000 <= series["tokens_per_min"][2] <= 63_000, series


#: The login page's red (an error) as the browser computes it.
_RED = "rgb(198, 40, 40)"
_COLOUR = "getComputedStyle(document.getElementById('message')).color"


async def test_the_login_page_shows_red_only_after_a_failed_attempt(tmp_path: Path) -> None:
    """Issue 34, point 29: the first visit's prompt is plain text; a wrong key, or a
    client's, is said in red."""
    async with browse() as browser, fake() as upstream, dashboard_server([deployment(upstream)], tmp_path / "s") as url:
        visit = await browser.visit(url + "/dashboard")
        assert await visit.texts("#message") == ["Log in with the admin key."]
        assert await visit.page.evaluate(_COLOUR) != _RED
        for key, said in (("sk-wrong-0123456789abcdef", "Wrong key."), (ALICE_KEY, "That is a client's key")):
            await visit.page.fill("input[name=key]", key)
            async with visit.page.expect_navigation():
                await visit.page.click("button[type=submit]")
            (shown,) = await visit.texts("#message")
            assert shown.startswith(said), shown
            assert await visit.page.evaluate(_COLOUR) == _RED


def _serve_args(tmp_path: Path, upstream_url: str) -> list[str]:
    """``sluice serve``'s arguments for a config with an admin key variable, one deployment, one client."""
    config = tmp_path / "sluice.toml"
    config.write_text(
        '[serve]\nadmin_key_env = "SLUICE_ADMIN_KEY"\n'
        f'[[deployment]]\nmodel = "openai/gpt-test"\nbase_url = "{upstream_url}"\napi_key_env = "UPSTREAM_KEY"\n'
        '[[client]]\nname = "alice"\nkey_env = "ALICE_KEY"\n'
    )
    return ["-m", "sluice", "serve", "--config", str(config), "--port", "0", "--state", str(tmp_path / "s")]


async def _cli(args: list[str], env: dict[str, str]) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, *args, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )


async def _listening(process: asyncio.subprocess.Process) -> tuple[str, str]:
    """The line ``sluice serve`` prints once it listens, and its URL."""
    assert process.stdout is not None
    async with asyncio.timeout(30):
        line = (await process.stdout.readline()).decode()
    return line, line.split("listening on ")[1].split()[0]


async def test_sluice_serve_names_its_dashboard_and_never_logs_the_admin_key(tmp_path: Path) -> None:
    async with fake() as upstream:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "SLUICE_ADMIN"))}
        env.update(UPSTREAM_KEY=UPSTREAM_KEY, ALICE_KEY=ALICE_KEY)
        args = _serve_args(tmp_path, upstream.url)
        missing = await _cli(args, env)
        async with asyncio.timeout(30):
            _, stderr = await missing.communicate()
        assert missing.returncode == 2
        assert "the admin key variable $SLUICE_ADMIN_KEY is not set" in stderr.decode()
        env["SLUICE_ADMIN_KEY"] = ADMIN_KEY
        process = await _cli(args, env)
        try:
            line, url = await _listening(process)
            assert f"dashboard {url}/dashboard" in line
            status, _, _ = await _get(url + "/dashboard/data", _bearer(ADMIN_KEY))
            assert status == 200
            login = {"data": {"key": ADMIN_KEY}, "allow_redirects": False}
            async with aiohttp.ClientSession() as http, http.post(url + "/dashboard/login", **login) as r:
                assert r.status == 303
        finally:
            process.terminate()
            async with asyncio.timeout(30):
                out, err = await process.communicate()
        assert process.returncode == 0, err.decode()
        logs = line + out.decode() + err.decode()
        assert "POST /dashboard/login" in logs  # the access log is on
        assert ADMIN_KEY not in logs


async def test_sluice_serve_logs_api_traffic_not_the_dashboards_polls(tmp_path: Path) -> None:
    """Issue 34, point 29: a dashboard polls every 2 s while its tab is open; the access log
    keeps the API's requests and a refused poll, not the answered polls."""
    async with fake() as upstream:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
        env.update(UPSTREAM_KEY=UPSTREAM_KEY, ALICE_KEY=ALICE_KEY, SLUICE_ADMIN_KEY=ADMIN_KEY)
        args = _serve_args(tmp_path, upstream.url)
        process = await _cli(args, env)
        try:
            _, url = await _listening(process)
            for _ in range(5):
                status, _, _ = await _get(url + "/dashboard/data", _bearer(ADMIN_KEY))
                assert status == 200
            status, _, _ = await _get(url + "/dashboard/data")  # no key: refused, and logged
            assert status == 401
            status, _, _ = await _get(url + "/v1/models", _bearer(ALICE_KEY))
            assert status == 200
            status, _, _ = await _get(url + "/dashboard", _bearer(ADMIN_KEY))  # the page itself: a visit
            assert status == 200
        finally:
            process.terminate()
            async with asyncio.timeout(30):
                _, err = await process.communicate()
        assert process.returncode == 0, err.decode()
        access = [entry for entry in err.decode().splitlines() if "aiohttp.access" in entry]
        assert [entry for entry in access if "GET /v1/models " in entry and '" 200 ' in entry], access
        assert [entry for entry in access if "GET /dashboard " in entry and '" 200 ' in entry], access
        polls = [entry for entry in access if "/dashboard/data" in entry]
        assert len(polls) == 1, polls  # the refused one only
        assert '" 401 ' in polls[0]


async def test_a_cooling_deployment_says_why_and_a_paused_one_for_how_long(tmp_path: Path) -> None:
    async with fake() as east, fake() as west, fake() as solo:
        deployments = [
            deployment(east, name="east"),
            deployment(west, name="west"),
            deployment_at(solo, "openai/gpt-solo", name="solo", price=PRICE),
        ]
        async with dashboard_server(deployments, tmp_path / "state") as url:
            alice = sdk(url, key=ALICE_KEY)
            west.inject("503", times=20)
            east.latency = west.latency = 0.2  # at once: both deployments get some (placement by headroom)
            questions = [
                alice.chat.completions.create(model="gpt-test", messages=ask(i), max_tokens=8) for i in range(12)
            ]
            await asyncio.gather(*questions)  # west's fail and go to east, until west cools down
            solo.inject("429", retry_after=3)
            solo_call = asyncio.create_task(alice.chat.completions.create(model="gpt-solo", messages=ask(99)))
            await solo.until(lambda: solo.stats.rate_limited == 1, timeout=10)
            try:

                async def paused() -> bool:
                    _, _, text = await _get(url + "/dashboard/data", _bearer(ADMIN_KEY))
                    return {d["name"]: d for d in json.loads(text)["deployments"]}["solo"]["paused_s"] > 0

                await until(paused)
                status, _, text = await _get(url + "/dashboard/data", _bearer(ADMIN_KEY))
            finally:
                solo_call.cancel()
                with contextlib.suppress(BaseException):
                    await solo_call
                await alice.close()
    assert status == 200
    found = {d["name"]: d for d in json.loads(text)["deployments"]}
    assert found["west"]["state"] == "cooling down"
    assert found["west"]["cooling_s"] > 0
    assert found["west"]["why"].startswith("server_error: ")
    assert found["west"]["failed"] >= 3
    assert found["east"]["state"] == "ok"
    assert found["east"]["why"] is None
    assert found["solo"]["state"] == "paused (429)"
    assert 0 < found["solo"]["paused_s"] <= 3
    assert found["solo"]["rate_limited"] == 1


def _own_address() -> str | None:
    """One of this machine's non-loopback IPv4 addresses (a UDP socket sends nothing to connect)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))
            address = str(probe.getsockname()[0])
        except OSError:
            return None
    return None if address.startswith("127.") or address == "0.0.0.0" else address


async def test_without_keys_a_request_from_another_address_is_refused(tmp_path: Path) -> None:
    address = _own_address()
    if address is None:
        pytest.skip("this machine has no non-loopback address to ask from")
    async with fake() as upstream:
        config = JobConfig((deployment(upstream),))
        app = build_app(config, ServeSettings(), (), tmp_path / "state", environ=ENV)
        runner = aiohttp.web.AppRunner(app)
        await runner.setup()
        try:
            site = aiohttp.web.TCPSite(runner, address, 0)
            await site.start()
            port = runner.addresses[0][1]
            status, _, body = await _get(f"http://{address}:{port}/dashboard/data")
        finally:
            await runner.cleanup()
    assert status == 403
    assert "loopback" in body


# -- what the review found: cost with many clients, hostile bodies and tokens, a flood of 401s ------


def _line_events(work: Callable[[], object]) -> int:
    """How many lines of ``serve/dashboard/_live.py`` ``work`` runs (a count of its work, not a timing)."""
    count = 0

    def local(frame: FrameType, event: str, arg: object) -> Any:
        nonlocal count
        if event == "line":
            count += 1
        return local

    def calls(frame: FrameType, event: str, arg: object) -> Any:
        return local if Path(frame.f_code.co_filename).name == "_live.py" else None

    sys.settrace(calls)
    try:
        work()
    finally:
        sys.settrace(None)
    return count


@contextlib.asynccontextmanager
async def _many_clients(n: int, state: Path) -> AsyncIterator[tuple[Live, str]]:
    """A server with ``n`` clients, each with results of three outcomes and a refusal."""
    specs = tuple(ClientSpec(f"c{i:04d}", f"KEY_{i}", budget_usd=5.0) for i in range(n))
    env = {f"KEY_{i}": f"sk-client-{i:04d}-0123456789" for i in range(n)} | {"ADMIN_KEY": ADMIN_KEY}
    async with fake() as upstream:
        config = JobConfig((deployment(upstream),))
        app = build_app(config, ServeSettings(admin_key_env="ADMIN_KEY"), specs, state, environ=env)
        live = app[LIVE]
        metrics = live.ctx.metrics
        for i, spec in enumerate(specs):
            for outcome, times in (("ok", 3 + i % 5), ("server_error", 1), ("rate_limited", 2)):
                metrics.results.labels(spec.name, "openai/gpt-test", outcome).inc(times)
            metrics.refused.labels(spec.name, "budget").inc(1 + i % 2)
            metrics.tokens.labels(spec.name, "openai/gpt-test", "input").inc(10 * i)
        async with listening(app) as url:
            yield live, url


async def test_the_clients_table_costs_one_pass_over_the_counters_and_one_over_the_clients(tmp_path: Path) -> None:
    work = {}
    for n in (60, 180):
        async with _many_clients(n, tmp_path / str(n)) as (live, _):
            work[n] = _line_events(live.snapshot)
            clients = {c["name"]: c for c in live.snapshot()["clients"]}
        assert len(clients) == n
        for i in (0, 1, n - 1):
            row = clients[f"c{i:04d}"]
            assert row["requests"] == 3 + i % 5 + 1 + 2
            assert row["errors"] == 3
            assert row["refused"] == {"budget": 1 + i % 2}
            assert row["tokens"] == 10 * i
            assert row["budget_usd"] == 5.0
    # three times the clients (and series): about three times the work, never nine
    assert work[180] < 4 * work[60], work


async def test_the_data_is_made_once_per_sample_whoever_polls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with _many_clients(3, tmp_path / "s") as (live, url):
        made = []
        snapshot = live.snapshot
        monkeypatch.setattr(live, "snapshot", lambda: made.append(1) or snapshot())
        before = live.ticks
        bodies = [await _get(url + "/dashboard/data", _bearer(ADMIN_KEY)) for _ in range(5)]  # five tabs
        assert all(status == 200 for status, _, _ in bodies)
        assert 1 <= len(made) <= 1 + live.ticks - before  # once, or once more if the sampler ticked meanwhile
        assert json.loads(bodies[-1][2])["clients"][0]["name"] == "c0000"
        seen = len(made)
        live.sample()
        status, _, _ = await _get(url + "/dashboard/data", _bearer(ADMIN_KEY))
        assert status == 200
        assert len(made) == seen + 1  # a new sample: a new snapshot


async def _raw(url: str, request: bytes, *, wait: float = 10.0) -> str:
    """Send ``request`` as it is; what came back within ``wait`` s (the connection left open)."""
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    try:
        writer.write(request)
        await writer.drain()
        data = b""
        with contextlib.suppress(TimeoutError, ConnectionError):
            async with asyncio.timeout(wait):
                while b"\r\n\r\n" not in data or not data.endswith(b"</html>\n"):
                    chunk = await reader.read(65536)
                    if not chunk:
                        break
                    data += chunk
        return data.decode("latin-1")
    finally:
        writer.close()


async def test_the_login_reads_no_more_than_its_form_can_hold(tmp_path: Path) -> None:
    async with fake() as upstream, dashboard_server([deployment(upstream)], tmp_path / "s", body_timeout_s=5) as url:
        head = "POST /dashboard/login HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\n"
        # a length over the form's: refused before a byte of the body is read (not a 408 after 5 s)
        answer = await _raw(url, (head + "Content-Length: 10000000\r\n\r\nkey=").encode(), wait=3)
        assert answer.startswith("HTTP/1.1 413"), answer[:200]
        # no length (chunked): read up to the form's limit, and refused there, the rest never waited for
        chunk = b"key=" + b"a" * 5000
        answer = await _raw(
            url, (head + "Transfer-Encoding: chunked\r\n\r\n").encode() + b"%x\r\n%s\r\n" % (len(chunk), chunk), wait=3
        )
        assert answer.startswith("HTTP/1.1 413"), answer[:200]
        async with aiohttp.ClientSession() as http:  # a form of the right size still logs in
            async with http.post(url + "/dashboard/login", data={"key": ADMIN_KEY}, allow_redirects=False) as r:
                assert r.status == 303
            async with http.post(url + "/dashboard/login", data={"key": "k" * 5000}, allow_redirects=False) as r:
                assert r.status == 413


async def test_odd_bytes_in_a_cookie_or_a_key_are_a_401_never_a_500(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with fake() as upstream, dashboard_server([deployment(upstream)], tmp_path / "s") as url:
        login = {"data": {"key": ADMIN_KEY}, "allow_redirects": False}
        async with aiohttp.ClientSession() as http, http.post(url + "/dashboard/login", **login) as r:
            _, nonce, signature = r.cookies["sluice_dashboard"].value.split(".")
        cookies = [
            "\u00b2".encode() + b"." + nonce.encode() + b"." + signature.encode(),  # isdigit() but not int()
            "\u0661\u0662".encode() + b".n.s",  # Arabic-Indic digits
            b"9999999999.\xff\xfe.sig",  # not UTF-8
            "9999999999.\u00e9.sig".encode(),
            b"9" * 300,
        ]
        requests = [b"Cookie: sluice_dashboard=" + cookie for cookie in cookies]
        requests += [b"Authorization: Bearer \xff\xfeabc", "Authorization: Bearer k\u00e9y-0123456789abcdef".encode()]
        for header in requests:
            for path in (b"/dashboard/data", b"/dashboard", b"/v1/models"):
                if path == b"/v1/models" and header.startswith(b"Cookie"):
                    continue
                request = b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n" + header + b"\r\nConnection: close\r\n\r\n"
                answer = await _raw(url, request)
                assert answer.startswith("HTTP/1.1 401"), (header, path, answer[:300])
    assert not [r for r in caplog.records if r.exc_info is not None or "internal error" in r.getMessage()]


def test_keys_must_be_printable_ascii(tmp_path: Path) -> None:
    config = JobConfig((Deployment("openai/gpt-test", base_url="http://127.0.0.1:9/v1", api_key="sk-x"),))
    settings = ServeSettings(admin_key_env="ADMIN_KEY")
    for odd in ({"ADMIN_KEY": "sk-admin-\u00e9-0123456789"}, {"ALICE_KEY": "sk-alice-\u00e9-0123456789"}):
        env = {**ENV, "ADMIN_KEY": ADMIN_KEY, **odd}
        with pytest.raises(ConfigError, match="printable ASCII"):  # no header could carry it
            build_app(config, settings, CLIENTS, tmp_path / "s", environ=env)


async def test_a_flood_of_wrong_keys_leaves_the_real_errors_in_view(tmp_path: Path) -> None:
    async with fake() as upstream, dashboard_server([deployment(upstream)], tmp_path / "s") as url:
        upstream.inject("503", times=10)
        alice = sdk(url, key=ALICE_KEY)
        with contextlib.suppress(Exception):
            await alice.chat.completions.create(model="gpt-test", messages=ask(1), max_tokens=8)
        await alice.close()
        async with aiohttp.ClientSession() as http:
            for _ in range(80):  # more than the ring holds
                async with http.get(url + "/v1/models", headers=_bearer("sk-nope-0123456789abcdef")) as r:
                    assert r.status == 401
            async with http.get(url + "/v1/models") as r:
                assert r.status == 401
        status, _, text = await _get(url + "/dashboard/data", _bearer(ADMIN_KEY))
    assert status == 200
    data = json.loads(text)
    kinds = {(e["source"], e["kind"]) for e in data["errors"]}
    assert ("upstream", "server_error") in kinds
    assert ("client", "server_error") in kinds
    assert not [e for e in data["errors"] if e["status"] == 401]
    assert data["unauthenticated"]["count"] == 81
    assert data["unauthenticated"]["last_at"] > time.time() - 60


async def test_a_logged_out_session_is_refused_here(tmp_path: Path) -> None:
    async with fake() as upstream, dashboard_server([deployment(upstream)], tmp_path / "s") as url:
        async with aiohttp.ClientSession() as http:
            async with http.post(url + "/dashboard/login", data={"key": ADMIN_KEY}, allow_redirects=False) as r:
                cookie = {"cookie": f"sluice_dashboard={r.cookies['sluice_dashboard'].value}"}
            async with http.post(url + "/dashboard/login", data={"key": ADMIN_KEY}, allow_redirects=False) as r:
                other = {"cookie": f"sluice_dashboard={r.cookies['sluice_dashboard'].value}"}
        assert (await _get(url + "/dashboard/data", cookie))[0] == 200
        async with aiohttp.ClientSession() as http:
            async with http.post(url + "/dashboard/logout", headers=cookie, allow_redirects=False) as r:
                assert r.status == 303
            async with http.get(url + "/dashboard", headers=cookie) as r:
                assert r.status == 401  # where it goes: the login form
        assert (await _get(url + "/dashboard/data", cookie))[0] == 401  # replayed after the logout
        assert (await _get(url + "/dashboard/data", other))[0] == 200  # another session goes on


# -- wrong keys back off ---------------------------------------------------------------------------


class _Clock:
    """A virtual clock for the backoff (the test moves it; nothing waits)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def _login_status(http: aiohttp.ClientSession, url: str, key: str) -> tuple[int, str | None]:
    async with http.post(url + "/dashboard/login", data={"key": key}, allow_redirects=False) as r:
        return r.status, r.headers.get("retry-after")


async def test_wrong_admin_keys_back_off_per_address(tmp_path: Path) -> None:
    """300 wrong keys as fast as they go: 6 are checked (5 free, then a doubling wait); the
    rest, and the right key while the address waits, are a 429 with Retry-After, never
    checked. Another address is not held back; the right key clears the address."""
    async with fake() as upstream:
        config = JobConfig((deployment(upstream),), retry=RetryPolicy(max_attempts=1))
        settings = ServeSettings(admin_key_env="ADMIN_KEY")
        app = build_app(config, settings, CLIENTS, tmp_path / "s", environ={**ENV, "ADMIN_KEY": ADMIN_KEY})
        clock = _Clock()
        app[BACKOFF].clock = clock
        async with listening(app) as url, aiohttp.ClientSession() as http:
            answers = [await _login_status(http, url, f"sk-guess-{i:020d}") for i in range(300)]
            right_while_waiting = await _login_status(http, url, ADMIN_KEY)
            bearer_while_waiting = await _get(url + "/dashboard/data", _bearer(ADMIN_KEY))
            cookie_free = await _get(url + "/dashboard/data")  # no key given: a plain 401, nothing to wait for
            connector = aiohttp.TCPConnector(local_addr=("127.0.0.2", 0))
            async with aiohttp.ClientSession(connector=connector) as elsewhere:
                other_wrong = await _login_status(elsewhere, url, "sk-guess-from-elsewhere-0")
                other_right = await _login_status(elsewhere, url, ADMIN_KEY)
            clock.now += 1.0  # the first wait is over: one more key is checked, and doubles it
            after_wait = await _login_status(http, url, "sk-guess-after-the-wait-0")
            doubled = await _login_status(http, url, ADMIN_KEY)
            clock.now += 2.0
            cleared = await _login_status(http, url, ADMIN_KEY)
            fresh = await _login_status(http, url, "sk-guess-after-a-login-00")
    checked = [status for status, _ in answers if status != 429]
    assert checked == [401] * 6
    assert [status for status, _ in answers[6:]] == [429] * 294
    assert {wait for _, wait in answers[6:]} == {"1"}
    assert right_while_waiting == (429, "1")  # the right key is not even checked while it waits
    assert bearer_while_waiting[0] == 429
    assert bearer_while_waiting[1]["retry-after"] == "1"
    assert json.loads(bearer_while_waiting[2])["error"]["code"] == "dashboard_throttled"
    assert cookie_free[0] == 401
    assert other_wrong == (401, None)
    assert other_right == (303, None)
    assert after_wait == (401, None)
    assert doubled == (429, "2")
    assert cleared == (303, None)
    assert fresh == (401, None)


def test_the_backoff_remembers_a_bounded_number_of_addresses() -> None:
    clock = _Clock()
    backoff = Backoff(entries=100, clock=clock)
    for i in range(10_000):  # a spray from many addresses
        backoff.failed(f"10.{i // 65536}.{i // 256 % 256}.{i % 256}")
    assert len(backoff) == 100  # the least recently seen are forgotten first
    for i in range(40):  # one IPv6 host with many addresses counts as its /64
        backoff.failed(f"2001:db8::{i:x}")
    assert backoff.wait("2001:db8::ffff") == CAP
    assert backoff.wait("2001:db8:0:1::1") == 0.0
    for step in range(1, 12):  # the wait doubles, up to its cap
        backoff.failed("192.0.2.1")
        expected = 0.0 if step <= FREE else min(CAP, 2.0 ** (step - FREE - 1))
        assert backoff.wait("192.0.2.1") == expected
    clock.now += FORGET + CAP + 1  # quiet long enough: every address is forgotten
    backoff.failed("192.0.2.9")
    assert len(backoff) == 1


# -- the error list between clients ------------------------------------------------------------------

RLO = "\u202e"  # RIGHT-TO-LEFT OVERRIDE: everything after it would read backwards


async def _chat_status(http: aiohttp.ClientSession, url: str, key: str, model: str) -> tuple[int, str]:
    body = {"model": model, "messages": ask(1), "max_tokens": 8}
    async with http.post(url + "/v1/chat/completions", json=body, headers=_bearer(key)) as r:
        return r.status, await r.text()


async def test_one_clients_flood_of_its_own_errors_leaves_the_others_in_view(tmp_path: Path) -> None:
    async with (
        fake() as upstream,
        dashboard_server([deployment(upstream)], tmp_path / "s") as url,
        aiohttp.ClientSession() as http,
    ):
        for i in range(60):  # alone, a client may fill the whole list
            assert (await _chat_status(http, url, BOB_KEY, f"no-such-model-{i}"))[0] == 404
        alone = json.loads((await _get(url + "/dashboard/data", _bearer(ADMIN_KEY)))[2])["errors"]
        status, answered = await _chat_status(http, url, ALICE_KEY, f"gpt-{RLO}tset")  # one error of alice's
        assert status == 404
        upstream.inject("503")  # one retried attempt: the deployment's note
        assert (await _chat_status(http, url, ALICE_KEY, "gpt-test"))[0] == 200
        for i in range(200):  # bob floods the list with his own 4xx
            assert (await _chat_status(http, url, BOB_KEY, f"no-such-model-{100 + i}"))[0] == 404
        errors: list[dict[str, Any]] = []

        async def newest_shown() -> bool:  # the data is made once per sample: wait for one after the flood
            errors[:] = json.loads((await _get(url + "/dashboard/data", _bearer(ADMIN_KEY)))[2])["errors"]
            return "no-such-model-299`" in errors[0]["message"]

        await until(newest_shown, timeout=60)
    assert len(alone) == 50
    assert {e["client"] for e in alone} == {"bob"}
    assert len(errors) == 50
    held = Counter((e["source"], e["client"] or e["deployment"]) for e in errors)
    assert held == {("client", "bob"): 48, ("client", "alice"): 1, ("upstream", "openai/gpt-test"): 1}
    assert errors[0]["message"].endswith("no-such-model-299` does not exist or you do not have access to it.")
    (alices,) = [e for e in errors if e["client"] == "alice"]
    # the name's bidi control is gone: the server's own words after it read as written
    assert alices["message"] == "The model `gpt-tset` does not exist or you do not have access to it."
    assert RLO not in answered
    assert RLO not in json.dumps(errors, ensure_ascii=False)
