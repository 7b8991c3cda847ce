"""Headless Chromium for tests: open a file or URL and see what the page did.

``async with open_page(target) as seen:`` loads ``target`` (a path or a URL) in Debian's
Chromium driven by Playwright, waits for it to settle, and gives a :class:`Seen`: the
console's errors, the page's uncaught exceptions, every URL it requested (the page's own
included), and the Playwright ``page`` itself, for DOM queries (``await
seen.page.locator(...)``), scripts (``await seen.page.evaluate(...)``) and screenshots.

A request to anything but the page's own origin (a ``file://`` page: anything but the
file itself) is recorded and refused, so a page that would fetch from the network fails
its test instead of hanging on the closed network. ``needs_chromium`` skips a test, with
the reason, only where Chromium or Playwright is missing; CI installs both (``.ci/run``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

#: Where Debian's chromium package puts the browser (``apt-get install chromium``).
CHROMIUM = os.environ.get("SLUICE_TEST_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
#: Flags that keep Chromium off the (closed) network and quick to start in a container;
#: Playwright adds ``--headless`` and a fresh ``--user-data-dir`` itself.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]


def _missing() -> str | None:
    if not Path(CHROMIUM).is_file():
        return f"Chromium is not installed at {CHROMIUM} (apt-get install chromium; .ci/run does)"
    try:
        import playwright.async_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install -e '.[test]')"
    return None


#: Marks a test that drives the browser: skipped, saying why, only without one.
needs_chromium = pytest.mark.skipif(_missing() is not None, reason=_missing() or "")


@dataclass
class Seen:
    """What a loaded page did, and the page to ask more of."""

    page: Any
    url: str
    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    #: Every URL the page asked for, in order (its own first).
    requests: list[str] = field(default_factory=list)
    #: Of those, the ones refused for being elsewhere (the network, another origin).
    refused: list[str] = field(default_factory=list)
    #: Messages of alert/confirm/prompt dialogs the page opened (dismissed at once).
    dialogs: list[str] = field(default_factory=list)

    @property
    def foreign_requests(self) -> list[str]:
        """Requests for anything but the page's own URL (a file) or origin (a server)."""
        return [url for url in self.requests if not _same_place(url, self.url)]

    async def text(self, selector: str) -> str:
        """The rendered text of the first element matching ``selector``."""
        return str(await self.page.locator(selector).first.inner_text())

    async def painted_canvases(self, selector: str = "canvas") -> int:
        """How many of the canvases matching ``selector`` have something drawn on them."""
        script = """(selector) => Array.from(document.querySelectorAll(selector)).filter((canvas) => {
            const ctx = canvas.getContext("2d");
            if (!ctx || !canvas.width || !canvas.height) return false;
            const pixels = ctx.getImageData(0, 0, canvas.width, canvas.height).data;
            for (let i = 3; i < pixels.length; i += 4) if (pixels[i] !== 0) return true;
            return false;
        }).length"""
        return int(await self.page.evaluate(script, selector))

    async def screenshot(self, path: Path, *, full_page: bool = True) -> Path:
        await self.page.screenshot(path=str(path), full_page=full_page)
        return path


def _same_place(url: str, page_url: str) -> bool:
    if url.startswith("data:") or url == "about:blank":
        return True
    mine, theirs = urlsplit(page_url), urlsplit(url)
    if mine.scheme == "file":
        return theirs.scheme == "file" and theirs.path == mine.path
    return (theirs.scheme, theirs.netloc) == (mine.scheme, mine.netloc)


@contextlib.asynccontextmanager
async def open_page(
    target: str | Path,
    *,
    width: int = 1280,
    height: int = 900,
    headers: dict[str, str] | None = None,
    wait_for: str | None = None,
    timeout_s: float = 30.0,
) -> AsyncIterator[Seen]:
    """Load ``target`` and yield what it did once it settled (the network idle, and
    ``wait_for``, a selector, present when given)."""
    from playwright.async_api import async_playwright

    url = _url_of(target)
    async with async_playwright() as driver:
        browser = await driver.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, timeout=timeout_s * 1000)
        try:
            context = await browser.new_context(
                viewport={"width": width, "height": height}, extra_http_headers=headers or {}, service_workers="block"
            )
            page = await context.new_page()
            seen = Seen(page, url)
            page.on("console", lambda message: _console(seen, message))
            page.on("pageerror", lambda error: seen.page_errors.append(str(error)))
            page.on("request", lambda request: seen.requests.append(request.url))
            page.on("dialog", lambda dialog: _dismiss(seen, dialog))

            async def guard(route: Any) -> None:
                if _same_place(route.request.url, url):
                    await route.continue_()
                else:
                    seen.refused.append(route.request.url)
                    await route.abort("blockedbyclient")

            await context.route("**/*", guard)
            page.set_default_timeout(timeout_s * 1000)
            await page.goto(url, wait_until="load")
            with contextlib.suppress(Exception):  # a page that polls is never idle: load is enough
                await page.wait_for_load_state("networkidle", timeout=2000)
            if wait_for is not None:
                await page.wait_for_selector(wait_for, state="attached")
            yield seen
        finally:
            await browser.close()


def _url_of(target: str | Path) -> str:
    return target.absolute().as_uri() if isinstance(target, Path) else str(target)


def _dismiss(seen: Seen, dialog: Any) -> None:
    seen.dialogs.append(dialog.message)
    asyncio.get_running_loop().create_task(dialog.dismiss())


def _console(seen: Seen, message: Any) -> None:
    if message.type == "error":
        seen.console_errors.append(message.text)
