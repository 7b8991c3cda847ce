"""The values that flow through sluice: Request, Result, Usage, Timings, Deployment.

Values only: no I/O here. They are frozen and slotted so they are cheap to create by
the million and safe to share between tasks.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from . import _json
from ._errors import ConfigError, InvalidRequestError, SluiceError
from ._fastinit import fast_frozen_init, maker
from ._schema import ASK_MODES, Schema

if TYPE_CHECKING:
    from .providers import Provider

__all__ = [
    "Deployment",
    "Native",
    "Price",
    "Priority",
    "Request",
    "Result",
    "Secret",
    "Timings",
    "Usage",
    "asked_as",
    "idempotency_key_of",
    "keyed_as",
    "request_key",
    "store_key",
]


class Priority:
    """Lanes: a lower number is served first; within a lane, first come first served."""

    INTERACTIVE = 0
    NORMAL = 50
    BATCH = 100


_KEY_VERSION = "sluice-request-v1"

#: Provider prefixes sluice knows without being told (``openai/gpt-4o-mini``).
BUILTIN_PROVIDERS = frozenset({"openai", "azure", "anthropic", "simulate"})


#: The APIs whose bodies a request may carry as written (``Request.native``).
NATIVE_APIS = frozenset({"anthropic", "responses"})


@dataclass(frozen=True, slots=True, eq=False)
class Native:
    """A request as its client wrote it for another API: Anthropic's Messages
    (``"anthropic"``) or OpenAI's Responses (``"responses"``).

    A deployment that speaks that API is sent ``body`` as it is (its model name put in),
    so whatever the client asked for (thinking, cache control, reasoning items...) reaches
    it; any other is sent the request's common (Chat Completions) fields, which hold the
    same request translated. ``lost`` says what the translation could not carry: a
    deployment that does not speak ``api`` refuses such a request with these words.
    """

    api: str
    body: Mapping[str, Any]
    lost: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.api not in NATIVE_APIS:
            raise InvalidRequestError(f"native api must be one of {sorted(NATIVE_APIS)}, got {self.api!r}")
        if not isinstance(self.body, Mapping):
            raise InvalidRequestError(f"a native body must be a JSON object, got {type(self.body).__name__}")


@fast_frozen_init
@dataclass(frozen=True, slots=True, eq=False)
class Request:
    """One chat completion to run.

    ``params`` holds any further provider parameters (``top_p``, ``tools``,
    ``response_format``...): they are passed through to the provider untouched.
    ``schema`` (a JSON Schema dict, a Pydantic model class or a
    :class:`~sluice.structured.Schema`) asks for a JSON answer of that shape: each
    provider is asked in its own way, the answer is validated and re-asked when invalid,
    and ``Result.parsed`` holds it (see :mod:`sluice.structured`).
    ``id`` is yours to set (a row id, a ``custom_id``); without one the request's
    content hash is used, which makes reruns and caching idempotent. ``native`` holds
    the body as a client of another API wrote it (see :class:`Native`); the other fields
    are then its translation.
    """

    model: str
    messages: Sequence[Mapping[str, Any]]
    max_tokens: int | None = None
    temperature: float | None = None
    params: Mapping[str, Any] = field(default_factory=dict)
    id: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    priority: int | None = None
    schema: Schema | None = None
    native: Native | None = None
    #: Its store key, kept by :func:`seal` on a request only sluice holds (see there).
    _key: str | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        problem = _request_problem(self)
        if problem is None and self.schema is not None and not isinstance(self.schema, Schema):
            try:
                object.__setattr__(self, "schema", Schema.of(self.schema))
            except InvalidRequestError as exc:
                problem = exc.message
        if problem is None and self.schema is not None and "response_format" in self.params:
            problem = "give the answer's shape once: schema= or params['response_format'], not both"
        if problem is None and self.schema is not None and ("tools" in self.params or "functions" in self.params):
            problem = (
                "a schema cannot go with tools: the answer may be a tool call, which has no JSON to "
                "check (send tools without a schema, or ask for the JSON without tools)"
            )
        if problem is None and self.native is not None and not isinstance(self.native, Native):
            problem = f"native must be a sluice.Native, got {type(self.native).__name__}"
        if problem is None and self.native is not None and self.schema is not None:
            problem = "a schema cannot go with a native body: give the answer's shape in the body itself"
        if problem:
            where = f"request {self.id!r}" if self.id is not None else "request"
            raise InvalidRequestError(f"{where}: {problem}")

    @classmethod
    def from_prompt(cls, model: str, prompt: str, **kwargs: Any) -> Request:
        """A one-message request: the everyday "ask this" case."""
        if cls is Request:  # not through type.__call__ (see _fastinit.maker): a map's every item
            return _make_request(model, [{"role": "user", "content": prompt}], **kwargs)
        return cls(model=model, messages=[{"role": "user", "content": prompt}], **kwargs)


_make_request = maker(Request)


def _request_problem(r: Request) -> str | None:
    """What is wrong with a request, in words, or None."""
    # ``type(x) is list/dict`` first: the ABC isinstance checks cost ~0.3 µs each, per request
    if not isinstance(r.model, str) or not r.model.strip():
        return f"model must be a non-empty string, got {r.model!r}"
    messages = r.messages
    if type(messages) is not list and (isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence)):
        return f"messages must be a list of {{'role': ..., 'content': ...}}, got {type(messages).__name__}"
    if not messages:
        return "messages is empty; give at least one message"
    for i, message in enumerate(messages):
        if type(message) is not dict and not isinstance(message, Mapping):
            return f"messages[{i}] must be an object, got {type(message).__name__}"
        role = message.get("role")
        if not role or (type(role) is not str and not isinstance(role, str)):
            return f"messages[{i}] needs a 'role' string"
        content = message.get("content")
        if content is None:
            if "tool_calls" not in message:
                return f"messages[{i}] has no 'content'"
        elif type(content) is not str and not isinstance(content, (str, list)):
            return f"messages[{i}].content must be a string or a list of parts, got {type(content).__name__}"
    if r.max_tokens is not None and (
        isinstance(r.max_tokens, bool) or not isinstance(r.max_tokens, int) or r.max_tokens < 1
    ):
        return f"max_tokens must be a positive integer, got {r.max_tokens!r}"
    if r.temperature is not None and not (_number(r.temperature) and r.temperature >= 0):
        return f"temperature must be a number >= 0, got {r.temperature!r}"
    if type(r.params) is not dict and not isinstance(r.params, Mapping):
        return f"params must be a mapping, got {type(r.params).__name__}"
    if type(r.metadata) is not dict and not isinstance(r.metadata, Mapping):
        return f"metadata must be a mapping, got {type(r.metadata).__name__}"
    if r.id is not None and not isinstance(r.id, str):
        return f"id must be a string, got {type(r.id).__name__}"
    if r.id is not None and not _valid_text(r.id):
        return "id is not valid Unicode text (it holds a lone surrogate)"
    if r.priority is not None and (isinstance(r.priority, bool) or not isinstance(r.priority, int)):
        return f"priority must be an integer, got {r.priority!r}"
    return None


def _valid_text(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def idempotency_key_of(key: str) -> str:
    """A header-safe form of a store key (ids may hold any character), the same on every
    run: a provider that honours ``Idempotency-Key`` answers a resent request once (and
    a provider batch's ``custom_id``)."""
    return "sluice-" + hashlib.sha256(key.encode()).hexdigest()[:32]


def store_key(request: Request) -> str:
    """The idempotency key of a request in a store: its id (when given) and its content.

    Two lines with the same content and no ids share a key, so the second is served
    from the first; a changed line under the same id gets a new key, so it is sent.
    """
    key = request._key
    if key is None:
        content = request_key(request)
        key = content if request.id is None else f"{request.id}\x1f{content}"
    return key


def seal(request: Request) -> Request:
    """Work out a request's store key once and keep it on the request: only for a request
    nobody else holds (a batch job's own, made from an input line), since its messages and
    params are plain containers that their owner could still change."""
    if request._key is None:
        object.__setattr__(request, "_key", store_key(request))
    return request


def asked_as(request: Request, model: str) -> Request:
    """The same request asked under another name of the same model (its batch tier,
    ``model@batch``), keeping its store key: the answer is the model's either way, so a
    rerun in another tier finds it, and a provider batch's lines keep their ids."""
    return keyed_as(dataclasses.replace(request, model=model), request)


def keyed_as(sent: Request, asked: Request) -> Request:
    """``sent`` (``asked`` changed only in how it is sent: another name of its model,
    prompt-cache marks) keeping ``asked``'s store key: stored answers and twins in flight
    are found as for ``asked``."""
    if sent is not asked:
        object.__setattr__(sent, "_key", store_key(asked))
    return sent


def _number(value: object) -> bool:
    """A finite int or float (not a bool, not an int too large for a float)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def request_key(request: Request) -> str:
    """A stable content hash of what the provider would see (versioned).

    Metadata, id and priority are left out: they do not change the answer. A schema is
    in (by its digest) only when there is one, so keys made before schemas are unchanged.
    """
    payload = {
        "v": _KEY_VERSION,
        "model": request.model,
        "messages": request.messages,
        "max_tokens": request.max_tokens,
        "temperature": request.temperature,
        "params": request.params,
    }
    if request.schema is not None:
        payload["schema"] = request.schema.digest
    if request.native is not None:  # what a deployment of its API is sent
        payload["native"] = {"api": request.native.api, "body": request.native.body}
    return hashlib.sha256(_json.canonical(payload)).hexdigest()[:32]


@fast_frozen_init
@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens as the provider reported them."""

    input_tokens: int = 0
    output_tokens: int = 0
    #: Of ``input_tokens``, those read from the provider's prompt cache (cheaper).
    cached_input_tokens: int = 0
    #: Of ``output_tokens``, those spent reasoning.
    reasoning_tokens: int = 0
    #: Of ``input_tokens``, those written to the prompt cache (dearer, on Anthropic).
    cache_write_tokens: int = 0
    #: Of ``cache_write_tokens``, those written for an hour (Anthropic's ``"ttl": "1h"``:
    #: twice the input price, where a 5-minute write is 1.25 times it).
    cache_write_1h_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cached_input_tokens + other.cached_input_tokens,
            self.reasoning_tokens + other.reasoning_tokens,
            self.cache_write_tokens + other.cache_write_tokens,
            self.cache_write_1h_tokens + other.cache_write_1h_tokens,
        )


@fast_frozen_init
@dataclass(frozen=True, slots=True)
class Timings:
    """Where a job's time went, in seconds.

    ``queued``: from submission until it passed the engine's concurrency gate;
    ``limiter_wait``: total time waiting for rate-limit capacity, over all attempts;
    ``latency``: the last attempt's time at the provider; ``total``: end to end;
    ``first_token``: for a stream, from submission until its first delta arrived (None
    when none did, and for a request that was not streamed).
    """

    queued: float = 0.0
    limiter_wait: float = 0.0
    latency: float = 0.0
    total: float = 0.0
    first_token: float | None = None


@fast_frozen_init
@dataclass(frozen=True, slots=True, eq=False)
class Result:
    """The outcome of one request: ``ok`` with text and usage, or a typed ``error``.

    ``request`` is None only for an input item that could not be made into a request;
    its ``error`` says why and ``index`` says where it was in the input.
    """

    request: Request | None
    text: str | None = None
    error: SluiceError | None = None
    usage: Usage = field(default_factory=Usage)
    raw: Mapping[str, Any] | None = None
    attempts: int = 0
    timings: Timings = field(default_factory=Timings)
    deployment: str | None = None
    finish_reason: str | None = None
    request_id: str | None = None
    index: int | None = None
    key: str | None = None
    #: Served from the store (an earlier run or an identical request): nothing was sent.
    cached: bool = False
    #: What this result cost, when the price of its model is known.
    cost_usd: float | None = None
    #: The model that answered: the one asked for, or a fallback (see ``Engine(fallbacks=)``).
    model: str | None = None
    #: How it was served: ``sync``, ``flex`` or ``batch`` (see ``Deployment.tier``).
    tier: str | None = None
    #: The provider batch that answered it, for the ``batch`` tier.
    batch_id: str | None = None
    #: For a request with a ``schema``: the validated answer (a Pydantic instance when the
    #: schema was a model); None when it is not valid (see ``error``, ``invalid_output``).
    parsed: Any = None
    #: How many times an invalid answer was re-asked (each one billed, in ``cost_usd``).
    reasks: int = 0
    #: Of ``cost_usd``, what the re-asks cost.
    reask_cost_usd: float | None = None

    @property
    def id(self) -> str:
        """The request's own id, else its content hash (computed on demand, not stored)."""
        if self.key is not None:
            return self.key
        if self.request is None:
            return f"item-{self.index}"
        return self.request.id if self.request.id is not None else store_key(self.request)  # kept if sealed

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def metadata(self) -> Mapping[str, Any]:
        return self.request.metadata if self.request is not None else {}

    def unwrap(self) -> str:
        """The text, or raise the error: for callers who want exceptions."""
        if self.error is not None:
            raise self.error
        return self.text or ""

    def __repr__(self) -> str:
        outcome = f"text={_clip(self.text)!r}" if self.ok else f"error={self.error!r}"
        return f"Result(id={self.id!r}, {outcome}, attempts={self.attempts}, deployment={self.deployment!r})"


def _clip(text: str | None, limit: int = 60) -> str | None:
    if text is None or len(text) <= limit:
        return text
    return text[: limit - 1] + "…"


class Secret:
    """An API key that never shows itself in a repr, a log line or an error."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def get(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('****')" if self._value else "Secret('')"

    __str__ = __repr__

    def __bool__(self) -> bool:
        return bool(self._value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __reduce__(self) -> Any:  # pickling must not be a way to leak it into a log
        raise TypeError("a Secret cannot be pickled")


#: How a deployment may be served (``Deployment.tier``).
TIERS = ("sync", "flex", "batch")

#: ``--tier auto`` asks for ``model + BATCH_SUFFIX``: the model's batch tier, which falls
#: back to the model itself (synchronous) when the deadline needs it.
BATCH_SUFFIX = "@batch"

#: What the flex tier and the Batch APIs bill, as a share of the synchronous price:
#: OpenAI's batch and flex, and Anthropic's Message Batches, are all half price
#: (overridable per deployment: ``options = {batch_discount = 0.5}``).
TIER_DISCOUNT = {"sync": 1.0, "flex": 0.5, "batch": 0.5}


@dataclass(frozen=True, slots=True)
class Price:
    """US dollars per million tokens, for a model genai-prices does not know (or to override it)."""

    input_per_mtok: float
    output_per_mtok: float
    cached_input_per_mtok: float | None = None
    cache_write_per_mtok: float | None = None
    #: An hour-long cache write (Anthropic's ``"ttl": "1h"``); None: twice the input price,
    #: as Anthropic bills it (genai-prices lists only the 5-minute write).
    cache_write_1h_per_mtok: float | None = None

    def __post_init__(self) -> None:
        for name in (
            "input_per_mtok",
            "output_per_mtok",
            "cached_input_per_mtok",
            "cache_write_per_mtok",
            "cache_write_1h_per_mtok",
        ):
            value = getattr(self, name)
            if value is None and name not in ("input_per_mtok", "output_per_mtok"):
                continue
            if not (_number(value) and value >= 0):
                raise ConfigError(f"price {name} must be a number >= 0 (USD per million tokens), got {value!r}")


#: A deployment's per-window limits: requests, tokens, input tokens, output tokens.
LIMIT_FIELDS = ("rpm", "tpm", "itpm", "otpm")


@dataclass(frozen=True, slots=True, eq=False)
class Deployment:
    """One place a model is served, with its limits.

    ``model`` is ``provider/model`` (``openai/gpt-4o-mini``, ``anthropic/claude-...``,
    ``simulate/fast``); a bare name means the OpenAI-compatible provider. ``rpm`` and
    ``tpm`` are requests and tokens per ``window`` seconds; ``itpm`` and ``otpm`` are
    input and output tokens per ``window`` seconds, limited apart (Anthropic's ITPM and
    OTPM: a request reserves its prompt estimate against ``itpm`` and its ``max_tokens``
    against ``otpm``, each settled to the usage reported); ``max_in_flight`` caps
    requests awaiting an answer. A per-window limit is paced evenly; ``burst_requests``
    and ``burst_tokens`` (for ``tpm``) allow that much extra at once, explicitly.
    """

    model: str
    rpm: float | None = None
    tpm: float | None = None
    max_in_flight: int | None = None
    window: float = 60.0
    burst_requests: float = 0.0
    burst_tokens: float = 0.0
    base_url: str | None = None
    api_key: Secret | str | None = None
    api_key_env: str | None = None
    name: str | None = None
    default_max_tokens: int = 1024
    headers: Mapping[str, str] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)
    provider: str | Provider | None = None
    price: Price | None = None
    #: Share of its group's traffic when several deployments serve one model (relative).
    weight: float = 1.0
    #: How it is served: ``sync`` (plain requests), ``flex`` (OpenAI's flex processing) or
    #: ``batch`` (the provider's Batch API); the last two are priced at a discount (see
    #: :mod:`sluice.tiers`).
    tier: str = "sync"
    #: Input tokens per ``window`` (prompt, cache writes; not cache reads), and output
    #: tokens per ``window``: limits of their own beside ``tpm`` (last, so that the
    #: fields before them keep their positions).
    itpm: float | None = None
    otpm: float | None = None

    def __post_init__(self) -> None:
        if isinstance(self.price, Mapping):
            known = [f.name for f in fields(Price)]
            unknown = sorted(str(k) for k in self.price if k not in known)
            missing = [k for k in ("input_per_mtok", "output_per_mtok") if k not in self.price]
            if unknown or missing:
                what = f"unknown key(s) {unknown}" if unknown else f"missing {missing}"
                raise ConfigError(f"deployment {self.label!r}: price: {what}; known: {known}")
            object.__setattr__(self, "price", Price(**self.price))
        problem = _deployment_problem(self)
        if problem:
            raise ConfigError(f"deployment {self.label!r}: {problem}")
        if isinstance(self.api_key, str):
            object.__setattr__(self, "api_key", Secret(self.api_key))

    @property
    def label(self) -> str:
        """The name shown in results and reports."""
        return self.name or self.model

    @property
    def provider_name(self) -> str:
        """``openai/x`` -> openai. An unknown prefix with a ``base_url`` is part of the model
        name (``meta-llama/Llama-3-8B`` on a vLLM server); without one it is an error later."""
        if self.provider is not None:
            if isinstance(self.provider, str):
                return self.provider
            return str(getattr(self.provider, "name", type(self.provider).__name__))
        prefix, sep, _ = self.model.partition("/")
        if not sep or (prefix not in BUILTIN_PROVIDERS and self.base_url is not None):
            return "openai"
        return prefix

    @property
    def model_name(self) -> str:
        """The model as the provider knows it (without the ``provider/`` prefix)."""
        prefix, sep, rest = self.model.partition("/")
        return rest if sep and prefix == self.provider_name else self.model

    def __repr__(self) -> str:
        limits = ", ".join(
            f"{k}={v}"
            for k, v in (
                ("rpm", self.rpm),
                ("tpm", self.tpm),
                ("itpm", self.itpm),
                ("otpm", self.otpm),
                ("max_in_flight", self.max_in_flight),
            )
            if v is not None
        )
        return f"Deployment({self.label!r}{', ' + limits if limits else ''})"


def _positive(value: object) -> bool:
    return _number(value) and value > 0  # type: ignore[operator]


def _key_env_problem(name: object) -> str | None:
    """``api_key_env`` names a variable; say so when it holds something else (never echoing
    what might be the key itself)."""
    if not isinstance(name, str) or not name.strip():
        return f"api_key_env must name an environment variable, got {name!r}"
    bare = name.strip().removeprefix("$").strip("{}")
    if name != bare and bare.replace("_", "").isalnum():
        return f"api_key_env names the variable, without the $: api_key_env = {bare!r}"
    if not name.replace("_", "").isalnum() or name[0].isdigit():
        return (
            "api_key_env must be the NAME of the environment variable that holds the key (such as "
            "'OPENAI_API_KEY'), not the key itself; it is not a valid variable name"
        )
    return None


def _deployment_problem(d: Deployment) -> str | None:
    if not isinstance(d.model, str) or not d.model.strip():
        return f"model must be a non-empty string, got {d.model!r}"
    if not _positive(d.window):
        return f"window must be a positive number of seconds, got {d.window!r}"
    for name in LIMIT_FIELDS:
        value = getattr(d, name)
        if value is not None and not _positive(value):
            return f"{name} must be a positive number, got {value!r}"
        if value is not None and value < 1:
            return f"{name} must be at least 1 per window; for fewer, lengthen window= (now {d.window:g} s)"
    if d.max_in_flight is not None and (
        isinstance(d.max_in_flight, bool) or not isinstance(d.max_in_flight, int) or d.max_in_flight < 1
    ):
        return f"max_in_flight must be a positive integer, got {d.max_in_flight!r}"
    for name in ("burst_requests", "burst_tokens"):
        value = getattr(d, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            return f"{name} must be a number >= 0, got {value!r}"
    if not _positive(d.weight):
        return f"weight must be a positive number, got {d.weight!r}"
    if d.tier not in TIERS:
        return f"tier must be one of {', '.join(TIERS)}, got {d.tier!r}"
    structured = d.options.get("structured") if isinstance(d.options, Mapping) else None
    if structured is not None and structured not in ASK_MODES:
        return f"options.structured must be one of {', '.join(ASK_MODES)}, got {structured!r}"
    responses = d.options.get("responses") if isinstance(d.options, Mapping) else None
    if responses is not None and not isinstance(responses, bool):
        return f"options.responses must be true or false (whether it serves OpenAI's Responses API), got {responses!r}"
    for name in ("flex_discount", "batch_discount"):
        share = d.options.get(name) if isinstance(d.options, Mapping) else None
        if share is not None and not (_number(share) and 0 < share <= 1):
            return f"options.{name} must be a share of the price in (0, 1] (0.5 is half price), got {share!r}"
    if not isinstance(d.default_max_tokens, int) or d.default_max_tokens < 1:
        return f"default_max_tokens must be a positive integer, got {d.default_max_tokens!r}"
    if d.api_key_env is not None:
        problem = _key_env_problem(d.api_key_env)
        if problem:
            return problem
    if d.base_url is not None and not (isinstance(d.base_url, str) and d.base_url.startswith(("http://", "https://"))):
        return f"base_url must start with http:// or https://, got {d.base_url!r}"
    return None
