"""A fake LLM provider on a real loopback socket, for tests and benchmarks.

``FakeServer`` speaks OpenAI Chat Completions (``POST /v1/chat/completions``), OpenAI
Responses (``POST /v1/responses``) and Anthropic Messages (``POST /v1/messages``) and
enforces rate limits the way the real providers do, so a client can be tested end to end
(limits, 429s with ``retry-after``, retries, faults, billing) without the internet or an
API key::

    from sluice.testing import FakeServer

    async def test_my_client() -> None:
        async with FakeServer(rpm=600, tpm=100_000, window=60.0) as server:
            server.inject("503", times=2)            # the next two requests fail
            ...  # point your client at server.url (OpenAI) or server.anthropic_url
            assert server.stats.duplicate_successes == 0

From synchronous code use ``with FakeServer().running_in_thread() as server:``; for a
server in its own process run ``python -m sluice.testing --port 0 --rpm 1200`` and read
the ``listening on http://127.0.0.1:PORT`` line it prints (``GET /_fake/stats`` returns
its counters as JSON).

Replies are deterministic: the text is ``"echo: "`` and the start of the last user
message; completion tokens are ``min(max_tokens, output_tokens)``. Prompt tokens are
counted by the fake's own tokenizer, never sluice's estimator, so a test can catch an
estimate that is too low: ``FakeServer(tokenizer="chars")`` (the default, ~4 characters
a token), ``"bytes"`` (one token per UTF-8 byte, the most a byte-level BPE tokenizer
bills) or any ``str -> int`` callable; images are charged by the providers' published
pixel formulas. A request reserves ``prompt + max_tokens`` tokens when admitted and is
settled to its real usage when answered; rejected requests do not count.

``ledger`` bills what a provider would: every generated answer, including one whose
client stopped waiting and the garbled or cut 200s of the ``malformed`` and
``truncated`` faults (``LedgerEntry.kind`` tells them from delivered answers). ``stats``
records what the client did, including ``duplicate_successes``: completions generated
for a key (``Idempotency-Key`` header, else the body's hash) that had already succeeded.

Prompts are cached as OpenAI and Anthropic document it (``FakeServer(prompt_cache=...)``,
``--prompt-cache``; see :mod:`sluice.testing._prompt_cache`): routing and overflow, 128-token
hits from 1,024 tokens, ``cache_control`` breakpoints with their lookback, minimums and
TTLs, reads free of ITPM, reads and writes billed at their prices; ``server.prompt_cache.stats``
counts what was read, written and spilled. By default (``"auto"``) only requests that ask
for caching are cached, so other tests see the usage and bills they always did.

``run_in_virtual_time(coro)`` runs a coroutine on an event loop whose clock jumps to the
next timer instead of waiting: a minute of rate limiting, retries and backoff in
milliseconds, deterministically (sluice's own limiter tests run this way).
"""

from __future__ import annotations

from ._cache_stats import CacheStats, PrefixStats
from ._faults import Fault, FaultSpec
from ._limits import openai_duration
from ._prompt_cache import PromptCacheSettings
from ._server import FakeServer
from ._stats import LedgerEntry, ServerStats
from ._virtual_time import VirtualTimeLoop, run_in_virtual_time

__all__ = [
    "CacheStats",
    "FakeServer",
    "Fault",
    "FaultSpec",
    "LedgerEntry",
    "PrefixStats",
    "PromptCacheSettings",
    "ServerStats",
    "VirtualTimeLoop",
    "openai_duration",
    "run_in_virtual_time",
]
