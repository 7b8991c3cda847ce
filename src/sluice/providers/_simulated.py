"""A simulated provider (``simulate/<anything>``): no network, no key, no cost.

It behaves like a real API so that the README's command works on a fresh machine and
users can rehearse a job: it takes time to answer, reports usage, enforces its own
rate limits with 429s and a ``retry-after`` hint, and fails when told to. Every reply
says it is simulated; streamed, it comes in a few chunks spread over its latency. Knobs
come from ``Deployment.options``:

============== ======== ==========================================================
option         default  meaning
============== ======== ==========================================================
latency        0.2      mean seconds per answer
jitter         0.5      latency varies uniformly by this fraction either way
server_rpm     none     the simulated server's own requests per window (429 past it)
server_tpm     none     the simulated server's own tokens per window
failure_rate   0.0      share of attempts answered with a 500
overload_rate  0.0      share of attempts answered with a 529 (overloaded)
output_tokens  [20,200] range of output tokens per reply (capped by max_tokens)
seed           0        random seed, for repeatable rehearsals
dimensions     1536     length of its embeddings (a request's ``dimensions`` wins)
============== ======== ==========================================================

Embeddings (``embed_batch``) are deterministic vectors seeded from each text; the
per-request limits ``embed_batch_size``, ``embed_batch_tokens`` and ``embed_input_tokens``
are read as for any deployment (see ``providers._embed``).
"""

from __future__ import annotations

import asyncio
import json
import random
import re
from collections import deque
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._errors import ConfigError, OverloadedError, RateLimitError, ServerError
from .._models import Deployment, Request, Usage
from .._tokens import estimate_message_tokens, estimate_text_tokens

# the fake server's way of making an answer of a schema's shape: one way, for both
from ..structured._ask import sent_params
from ._base import Reply, estimate_request_tokens
from ._embed import EmbedInput, EmbedReply, simulated_vector
from ._events import Finish, StreamEvent, StreamStart, TextDelta, UsageUpdate

__all__ = ["SimulatedProvider"]

_KNOWN = {
    "latency",
    "jitter",
    "server_rpm",
    "server_tpm",
    "failure_rate",
    "overload_rate",
    "output_tokens",
    "seed",
    # embeddings (see ._embed): per-request limits, and the vectors' default length
    "embed_batch_size",
    "embed_batch_tokens",
    "embed_input_tokens",
    "dimensions",
}


#: How many chunks a streamed simulated reply comes in (at most).
_CHUNKS = 6


@dataclass(slots=True)
class _State:
    """One simulated server per deployment: its knobs, randomness and window."""

    latency: float
    jitter: float
    server_rpm: float | None
    server_tpm: float | None
    failure_rate: float
    overload_rate: float
    output_tokens: tuple[int, int]
    rng: random.Random
    window: float
    accepted: deque[tuple[float, int]] = field(default_factory=deque)
    used_tokens: int = 0
    counter: int = 0


def _number(options: dict[str, Any], name: str, default: float | None, label: str) -> float | None:
    value = options.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ConfigError(f"deployment {label!r}: option {name} must be a number >= 0, got {value!r}")
    return float(value)


def _state_for(deployment: Deployment) -> _State:
    options = dict(deployment.options)
    unknown = set(options) - _KNOWN - {"max_tokens_field"}
    label = deployment.label
    if unknown:
        raise ConfigError(
            f"deployment {label!r}: unknown simulate option(s) {sorted(unknown)}; known: {sorted(_KNOWN)}"
        )
    low_high = options.get("output_tokens", (20, 200))
    if (
        not isinstance(low_high, (list, tuple))
        or len(low_high) != 2
        or not all(isinstance(n, int) and n >= 0 for n in low_high)
        or low_high[0] > low_high[1]
    ):
        raise ConfigError(f"deployment {label!r}: output_tokens must be [low, high], got {low_high!r}")
    seed = options.get("seed", 0)
    return _State(
        latency=_number(options, "latency", 0.2, label) or 0.0,
        jitter=min(1.0, _number(options, "jitter", 0.5, label) or 0.0),
        server_rpm=_number(options, "server_rpm", None, label),
        server_tpm=_number(options, "server_tpm", None, label),
        failure_rate=_number(options, "failure_rate", 0.0, label) or 0.0,
        overload_rate=_number(options, "overload_rate", 0.0, label) or 0.0,
        output_tokens=(int(low_high[0]), int(low_high[1])),
        rng=random.Random(seed),
        window=deployment.window,
    )


class SimulatedProvider:
    """See the module docstring; one instance serves every ``simulate/...`` deployment."""

    name = "simulate"

    def __init__(self) -> None:
        self._states: dict[int, tuple[Deployment, _State]] = {}

    def state(self, deployment: Deployment) -> _State:
        entry = self._states.get(id(deployment))
        if entry is None or entry[0] is not deployment:
            entry = (deployment, _state_for(deployment))
            self._states[id(deployment)] = entry
        return entry[1]

    def estimate_tokens(self, request: Request, deployment: Deployment) -> int:
        return estimate_request_tokens(request, deployment)

    async def send(self, request: Request, deployment: Deployment, *, idempotency_key: str | None = None) -> Reply:
        state, delay = self._begin(request, deployment)
        if delay > 0:
            await asyncio.sleep(delay)
        return self._reply(state, request, deployment)

    async def stream(
        self, request: Request, deployment: Deployment, *, idempotency_key: str | None = None
    ) -> AsyncIterator[StreamEvent]:
        """The reply in a few chunks, word by word, its latency spread over them: a quarter
        before the first, the rest between the others."""
        state, delay = self._begin(request, deployment)
        yield StreamStart()
        if delay > 0:
            await asyncio.sleep(delay / 4)
        reply = self._reply(state, request, deployment)
        words = re.findall(r"\S+\s*", reply.text or "")
        size = max(1, -(-len(words) // _CHUNKS))
        chunks = ["".join(words[i : i + size]) for i in range(0, len(words), size)]
        for number, chunk in enumerate(chunks):
            if number and delay > 0:
                await asyncio.sleep(delay * 3 / 4 / (len(chunks) - 1))
            yield TextDelta(chunk)
        yield UsageUpdate(reply.usage)
        yield Finish(reply.finish_reason)

    def _begin(self, request: Request, deployment: Deployment) -> tuple[_State, float]:
        """Admission and the faults; the seconds the answer takes."""
        state = self.state(deployment)
        now = asyncio.get_running_loop().time()
        cost = self.estimate_tokens(request, deployment)
        self._admit(state, now, cost, deployment.label)
        roll = state.rng.random()
        if roll < state.failure_rate:
            raise ServerError("simulated server error", status=500)
        if roll < state.failure_rate + state.overload_rate:
            raise OverloadedError("simulated overload", status=529)
        spread = state.latency * state.jitter
        return state, state.latency + (state.rng.uniform(-spread, spread) if spread else 0.0)

    def _reply(self, state: _State, request: Request, deployment: Deployment) -> Reply:
        prompt = estimate_message_tokens(request.messages, sent_params(request))
        low, high = state.output_tokens
        limit = request.max_tokens or deployment.default_max_tokens
        output = min(limit, state.rng.randint(low, high))
        state.counter += 1
        if request.schema is not None:  # a rehearsal of a structured job: JSON of its shape
            # The fake's schema-instance maker, imported here: sluice.testing (the fake server
            # and aiohttp.web) stays out of the engine's import path.
            from ..testing._structured import instance

            text = json.dumps(instance(request.schema.json_schema, request.schema.json_schema))
            output = max(output, 1)
        else:
            last = str(request.messages[-1].get("content", ""))[:80]
            text = f"[simulated reply {state.counter}] {last}"
        return Reply(
            text=text,
            usage=Usage(input_tokens=prompt, output_tokens=output),
            raw={"simulated": True, "id": f"sim-{state.counter}"},
            finish_reason="length" if output == limit else "stop",
            request_id=f"sim-{state.counter}",
        )

    def _admit(self, state: _State, now: float, cost: int, label: str) -> None:
        """The simulated server's own sliding-window limits: 429 with a retry-after hint."""
        horizon = now - state.window
        while state.accepted and state.accepted[0][0] <= horizon:
            state.used_tokens -= state.accepted.popleft()[1]
        over_requests = state.server_rpm is not None and len(state.accepted) + 1 > state.server_rpm
        over_tokens = state.server_tpm is not None and state.used_tokens + cost > state.server_tpm
        if over_requests or over_tokens:
            wait = state.accepted[0][0] + state.window - now if state.accepted else state.window
            kind = "requests" if over_requests else "tokens"
            raise RateLimitError(f"simulated rate limit reached for {kind} on {label}", status=429, retry_after=wait)
        state.accepted.append((now, cost))
        state.used_tokens += cost

    def takes_token_arrays(self, deployment: Deployment) -> bool:
        return True

    async def embed_batch(
        self,
        texts: Sequence[EmbedInput],
        deployment: Deployment,
        *,
        params: Mapping[str, Any],
        idempotency_key: str | None = None,
    ) -> EmbedReply:
        """Deterministic vectors (the same text, the same vector), after the simulated
        server's limits, faults and latency; ``dimensions`` from the request, else the
        deployment's ``dimensions`` option, else 1536."""
        state = self.state(deployment)
        tokens = sum(estimate_text_tokens(text) if isinstance(text, str) else len(text) for text in texts)
        self._admit(state, asyncio.get_running_loop().time(), tokens, deployment.label)
        roll = state.rng.random()
        if roll < state.failure_rate:
            raise ServerError("simulated server error", status=500)
        if roll < state.failure_rate + state.overload_rate:
            raise OverloadedError("simulated overload", status=529)
        spread = state.latency * state.jitter
        delay = state.latency + (state.rng.uniform(-spread, spread) if spread else 0.0)
        if delay > 0:
            await asyncio.sleep(delay)
        size = params.get("dimensions") or deployment.options.get("dimensions") or 1536
        state.counter += 1
        vectors = [simulated_vector(text if isinstance(text, str) else repr(list(text)), int(size)) for text in texts]
        return EmbedReply(vectors, Usage(input_tokens=tokens), request_id=f"sim-{state.counter}")

    async def aclose(self) -> None:
        """Nothing to release."""

    def __repr__(self) -> str:
        return "<SimulatedProvider>"
