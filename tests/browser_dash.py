"""A real browser for the tests: Debian's headless Chromium, driven by Playwright.

``async with browse() as browser`` starts Chromium (``/usr/bin/chromium``, never a browser
Playwright would download: the network is closed) with the flags it needs to start
without reaching out; ``await browser.visit(url)`` opens a page that records its console
errors, uncaught page errors and every URL it requests. :func:`chromium_or_skip` skips a
test, saying why, only when Chromium is not installed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from browser import CHROMIUM, CHROMIUM_ARGS

__all__ = ["Browser", "Visit", "browse", "chromium_or_skip"]

#: ``browser``'s flags (off the closed network), and headless: Playwright's ``launch`` here
#: takes the flags as given.
FLAGS = ["--headless", *CHROMIUM_ARGS]


def chromium_or_skip() -> str:
    """Chromium's path; the test is skipped (with the reason) when it is not installed."""
    found = CHROMIUM
    if not Path(found).exists():
        pytest.skip("headless Chromium is not installed (apt-get install chromium; .ci/run installs it)")
    pytest.importorskip("playwright.async_api", reason="playwright is not installed (the test extra has it)")
    return found


@dataclass
class Visit:
    """One page, and what it did."""

    page: Any
    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    requested: list[str] = field(default_factory=list)

    async def texts(self, selector: str) -> list[str]:
        """The text of every element ``selector`` finds."""
        return [str(t) for t in await self.page.locator(selector).all_text_contents()]

    async def count(self, selector: str) -> int:
        return int(await self.page.locator(selector).count())

    async def attribute(self, selector: str, name: str) -> str | None:
        value = await self.page.locator(selector).first.get_attribute(name)
        return None if value is None else str(value)

    async def wait_for(self, expression: str, timeout: float = 20.0) -> None:  # noqa: ASYNC109
        """Until the JavaScript ``expression`` is true in the page. Asked from here, not with
        Playwright's ``wait_for_function``: that one evals in the page, which a strict
        Content-Security-Policy (no ``unsafe-eval``) rightly refuses."""
        async with asyncio.timeout(timeout):
            while not await self.page.evaluate(f"() => Boolean({expression})"):  # noqa: ASYNC110
                await asyncio.sleep(0.1)

    async def screenshot(self, path: Path, **options: Any) -> None:
        await self.page.screenshot(path=str(path), **options)


class Browser:
    def __init__(self, browser: Any) -> None:
        self._browser = browser

    async def visit(
        self,
        url: str,
        *,
        headers: dict[str, str] | None = None,
        viewport: tuple[int, int] = (1280, 900),
        wait: bool = True,
    ) -> Visit:
        """Open ``url`` in a fresh context (no cookies), recording what the page does."""
        context = await self._browser.new_context(
            extra_http_headers=headers or {}, viewport={"width": viewport[0], "height": viewport[1]}
        )
        page = await context.new_page()
        visit = Visit(page)
        page.on("console", lambda m: visit.console_errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: visit.page_errors.append(str(e)))
        page.on("request", lambda r: visit.requested.append(r.url))
        await page.goto(url, wait_until="load" if wait else "commit")
        return visit


@contextlib.asynccontextmanager
async def browse() -> AsyncIterator[Browser]:
    """Headless Chromium for the duration of the block."""
    executable = chromium_or_skip()
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=executable, args=FLAGS, headless=True)
        try:
            yield Browser(browser)
        finally:
            await browser.close()
