"""The clients the benchmarks compare, each written the way a user would write it.

Every client sends the same request shape — one user message and ``max_tokens`` — to
the fake server's ``/v1/chat/completions`` and counts what came back. Libraries are
imported inside :func:`make_client`, so a peer that is not installed (or fails to
import) is reported as such (:class:`NotInstalledError`) and the import is never part
of a timed section.
"""

from __future__ import annotations

import asyncio
import importlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = [
    "CLIENTS",
    "LABELS",
    "REQUIRES",
    "Client",
    "NotInstalledError",
    "Settings",
    "Tally",
    "make_client",
    "messages_for",
]

#: The model name the server sees from every client.
MODEL_NAME = "bench"
#: How sluice and LiteLLM name it (the OpenAI-compatible provider, model ``bench``).
PROVIDER_MODEL = f"openai/{MODEL_NAME}"

#: Short names, in the order the tables list them.
CLIENTS = ("raw-aiohttp", "sluice", "sluice-gather", "openai", "litellm-router")


@dataclass(frozen=True)
class Settings:
    """How to build a client. ``url`` is the OpenAI-style base URL (``.../v1``)."""

    url: str
    concurrency: int
    max_tokens: int
    #: The model the server sees ("bench": no known price; e.g. "gpt-4o-mini": priced by genai-prices).
    model: str = MODEL_NAME
    #: Limits to configure on clients that take them (per ``window`` seconds).
    rpm: float | None = None
    tpm: float | None = None
    window: float = 60.0
    #: raw aiohttp: retry 429s, sleeping for ``retry-after``, up to ``max_attempts`` tries.
    retry_429: bool = False
    max_attempts: int = 10
    #: the openai SDK's ``max_retries`` (its default is 2).
    openai_max_retries: int = 2
    #: LiteLLM Router: ``routing_strategy`` and ``num_retries`` (None: LiteLLM's default).
    litellm_strategy: str | None = None
    litellm_num_retries: int | None = None


@dataclass
class Tally:
    """What one run of a client got back."""

    ok: int = 0
    errors: int = 0
    samples: list[str] = field(default_factory=list)
    #: Retries and 429s as the client itself saw them, where it tells (else None).
    retries: int | None = None
    rate_limited: int | None = None

    def fail(self, what: object) -> None:
        self.errors += 1
        if len(self.samples) < 3:
            text = what if isinstance(what, str) else f"{type(what).__name__}: {what}"
            self.samples.append(text[:300])


class Client(Protocol):
    async def run(self, prompts: Sequence[str]) -> Tally:
        """Send one request per prompt (at most ``concurrency`` at once) and count the results."""
        ...

    async def aclose(self) -> None: ...


def messages_for(prompt: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt}]


class RawAiohttp:
    """The floor: one ``aiohttp.ClientSession``, a semaphore, post JSON, read, ``json.loads``.

    With ``retry_429`` it is the script a careful user writes: on a 429, sleep for the
    ``retry-after`` seconds (holding its semaphore slot) and send again.
    """

    def __init__(self, settings: Settings) -> None:
        import aiohttp

        self.settings = settings
        self.url = f"{settings.url}/chat/completions"
        self.headers = {"Authorization": "Bearer x"}
        self.session = aiohttp.ClientSession()

    async def run(self, prompts: Sequence[str]) -> Tally:
        s = self.settings
        session, url, headers = self.session, self.url, self.headers
        semaphore = asyncio.Semaphore(s.concurrency)
        tally = Tally(retries=0, rate_limited=0)

        async def one(prompt: str) -> None:
            body = {"model": s.model, "messages": messages_for(prompt), "max_tokens": s.max_tokens}
            async with semaphore:
                try:
                    for attempt in range(1, s.max_attempts + 1):
                        async with session.post(url, json=body, headers=headers) as response:
                            data = await response.read()
                            status = response.status
                            retry_after = response.headers.get("retry-after")
                        if status == 200:
                            reply = json.loads(data)
                            if isinstance(reply["choices"][0]["message"]["content"], str):
                                tally.ok += 1
                            else:
                                tally.fail("no text in the reply")
                            return
                        if status == 429:
                            assert tally.rate_limited is not None
                            tally.rate_limited += 1
                            if s.retry_429 and attempt < s.max_attempts:
                                assert tally.retries is not None
                                tally.retries += 1
                                await asyncio.sleep(float(retry_after or 1.0))
                                continue
                        tally.fail(f"HTTP {status}: {data[:200]!r}")
                        return
                except Exception as exc:
                    tally.fail(exc)

        await asyncio.gather(*(one(p) for p in prompts))
        return tally

    async def aclose(self) -> None:
        await self.session.close()


class Sluice:
    """``sluice.Engine`` over one ``Deployment``; ``engine.map(requests)`` (or
    ``asyncio.gather(engine.complete(...))`` with ``via="gather"``)."""

    def __init__(self, settings: Settings, *, via: str = "map") -> None:
        import sluice

        self.sluice = sluice
        self.settings = settings
        self.via = via
        self.model = f"openai/{settings.model}"
        deployment = sluice.Deployment(
            self.model,
            base_url=settings.url,
            api_key="x",
            rpm=settings.rpm,
            tpm=settings.tpm,
            window=settings.window,
        )
        self.engine = sluice.Engine(deployment, concurrency=settings.concurrency)

    async def setup(self) -> None:
        """What ``async with Engine(...)`` does before a user's first request."""
        await self.engine.start()

    async def run(self, prompts: Sequence[str]) -> Tally:
        sluice, engine, max_tokens = self.sluice, self.engine, self.settings.max_tokens
        retries, rate_limited = engine.stats.retries, engine.stats.rate_limited
        tally = Tally()
        if self.via == "map":
            requests = (sluice.Request.from_prompt(self.model, p, max_tokens=max_tokens) for p in prompts)
            async for result in engine.map(requests):
                if result.ok:
                    tally.ok += 1
                else:
                    tally.fail(result.error)
        else:
            results = await asyncio.gather(*(engine.complete(self.model, p, max_tokens=max_tokens) for p in prompts))
            for result in results:
                if result.ok:
                    tally.ok += 1
                else:
                    tally.fail(result.error)
        tally.retries = engine.stats.retries - retries
        tally.rate_limited = engine.stats.rate_limited - rate_limited
        return tally

    async def aclose(self) -> None:
        await self.engine.close()


class OpenAISDK:
    """``AsyncOpenAI(base_url=..., api_key="x", max_retries=...)`` and a semaphore."""

    def __init__(self, settings: Settings) -> None:
        import openai

        self.openai = openai
        self.settings = settings
        self.client = openai.AsyncOpenAI(base_url=settings.url, api_key="x", max_retries=settings.openai_max_retries)

    async def run(self, prompts: Sequence[str]) -> Tally:
        s, client, openai = self.settings, self.client, self.openai
        semaphore = asyncio.Semaphore(s.concurrency)
        tally = Tally(rate_limited=0)

        async def one(prompt: str) -> None:
            async with semaphore:
                try:
                    reply = await client.chat.completions.create(
                        model=s.model, messages=messages_for(prompt), max_tokens=s.max_tokens
                    )
                except openai.RateLimitError as exc:  # after its own retries
                    assert tally.rate_limited is not None
                    tally.rate_limited += 1
                    tally.fail(exc)
                    return
                except Exception as exc:
                    tally.fail(exc)
                    return
            if isinstance(reply.choices[0].message.content, str):
                tally.ok += 1
            else:
                tally.fail("no text in the reply")

        await asyncio.gather(*(one(p) for p in prompts))
        return tally

    async def aclose(self) -> None:
        await self.client.close()


class LiteLLMRouter:
    """``litellm.Router`` with one deployment on the fake server, and a semaphore.

    With limits, ``rpm``/``tpm`` go on the deployment. LiteLLM counts them per minute,
    so a limit per ``window`` seconds is given to it as the same rate per 60 s.
    """

    def __init__(self, settings: Settings) -> None:
        from litellm import Router

        self.settings = settings
        params: dict[str, Any] = {"model": f"openai/{settings.model}", "api_base": settings.url, "api_key": "x"}
        per_minute = 60.0 / settings.window
        if settings.rpm is not None:
            params["rpm"] = int(settings.rpm * per_minute)
        if settings.tpm is not None:
            params["tpm"] = int(settings.tpm * per_minute)
        options: dict[str, Any] = {}
        if settings.litellm_strategy is not None:
            options["routing_strategy"] = settings.litellm_strategy
        if settings.litellm_num_retries is not None:
            options["num_retries"] = settings.litellm_num_retries
        self.router = Router(model_list=[{"model_name": settings.model, "litellm_params": params}], **options)

    async def run(self, prompts: Sequence[str]) -> Tally:
        s, router = self.settings, self.router
        semaphore = asyncio.Semaphore(s.concurrency)
        tally = Tally()

        async def one(prompt: str) -> None:
            async with semaphore:
                try:
                    reply: Any = await router.acompletion(
                        model=s.model, messages=messages_for(prompt), max_tokens=s.max_tokens
                    )
                except Exception as exc:
                    tally.fail(exc)
                    return
            if isinstance(reply.choices[0].message.content, str):
                tally.ok += 1
            else:
                tally.fail("no text in the reply")

        await asyncio.gather(*(one(p) for p in prompts))
        return tally

    async def aclose(self) -> None:
        return None


class NotInstalledError(Exception):
    """The client's library is missing or fails to import."""


def make_client(name: str, settings: Settings) -> Client:
    """Build a client by its short name; NotInstalledError when its library cannot be imported.

    Call it inside the running event loop (aiohttp sessions bind to it).
    """
    try:
        importlib.import_module(REQUIRES[name])
    except KeyError:
        raise ValueError(f"unknown client {name!r}; choose from {', '.join(CLIENTS)}") from None
    except Exception as exc:  # a peer that fails to import is "not installed", whatever the reason
        raise NotInstalledError(f"{REQUIRES[name]}: {type(exc).__name__}: {exc}") from exc
    if name == "raw-aiohttp":
        return RawAiohttp(settings)
    if name == "sluice":
        return Sluice(settings, via="map")
    if name == "sluice-gather":
        return Sluice(settings, via="gather")
    if name == "openai":
        return OpenAISDK(settings)
    if name == "litellm-router":
        return LiteLLMRouter(settings)
    raise ValueError(f"unknown client {name!r}; choose from {', '.join(CLIENTS)}")


#: The module each client needs, to tell "not installed" without importing it.
REQUIRES = {
    "raw-aiohttp": "aiohttp",
    "sluice": "sluice",
    "sluice-gather": "sluice",
    "openai": "openai",
    "litellm-router": "litellm",
}

#: How each client is labelled in the tables.
LABELS = {
    "raw-aiohttp": "raw aiohttp + semaphore",
    "sluice": "sluice Engine.map",
    "sluice-gather": "sluice gather(Engine.complete)",
    "openai": "openai SDK + semaphore",
    "litellm-router": "LiteLLM Router + semaphore",
}
