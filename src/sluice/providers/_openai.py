"""OpenAI-compatible chat completions: OpenAI, Azure OpenAI, vLLM, Ollama, OpenRouter,
Together, Groq, DeepSeek — anything that speaks ``POST {base_url}/chat/completions``.

Like the official SDK, the base URL and key default to ``OPENAI_BASE_URL`` and
``OPENAI_API_KEY``.

OpenAI and Azure also serve the Responses API (``POST {base_url}/responses``): a request
whose ``native`` body was written for it goes there as it is, to a deployment that has it
(see :meth:`OpenAIProvider.speaks`), and its answer is read by :mod:`._responses`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from .._errors import ConfigError, MalformedResponseError
from .._limits import RateLimitSnapshot
from .._models import Deployment, Request, Usage
from .._ratelimit import make_snapshot
from ._base import Reply, make_reply
from ._http import HttpProvider, HttpTransport, StreamDecoder, header_number, missing_key_message, resolve_key
from ._openai_stream import OpenAIStreamDecoder, openai_usage

if TYPE_CHECKING:
    from ._embed import EmbedInput, EmbedReply

# The Responses API's parsing (``._responses``) and embeddings (``._embed``) are imported
# where they are used: a chat job needs neither, and compiling them is import time.

__all__ = ["AzureOpenAIProvider", "OpenAIProvider", "parse_openai_duration"]

DEFAULT_BASE_URL = "https://api.openai.com/v1"

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNIT_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


def parse_openai_duration(text: str | None) -> float | None:
    """OpenAI's reset format (``"1s"``, ``"6m0s"``, ``"20ms"``, ``"1h2m3.5s"``) in seconds."""
    if not text:
        return None
    text = text.strip()
    try:
        return max(0.0, float(text))  # some compatible servers send plain seconds
    except ValueError:
        pass
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    return sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)


class OpenAIProvider(HttpProvider):
    """``POST {base_url}/chat/completions`` with a bearer key."""

    name = "openai"
    key_env = "OPENAI_API_KEY"
    base_url_env = "OPENAI_BASE_URL"

    def __init__(self, transport: HttpTransport) -> None:
        super().__init__(transport)
        self._shapes: dict[int, tuple[Deployment, str, str]] = {}

    def base_url(self, deployment: Deployment) -> str:
        return (deployment.base_url or os.environ.get(self.base_url_env) or DEFAULT_BASE_URL).rstrip("/")

    def endpoint(self, deployment: Deployment) -> tuple[str, dict[str, str]]:
        base = self.base_url(deployment)
        key = resolve_key(deployment, self.key_env)
        if not key:
            raise ConfigError(missing_key_message(deployment, self.key_env, base))
        return f"{base}/chat/completions", {"authorization": f"Bearer {key.get()}"}

    def _max_tokens_field(self, deployment: Deployment) -> str:
        configured = deployment.options.get("max_tokens_field")
        if isinstance(configured, str):
            return configured
        # OpenAI's reasoning models refuse "max_tokens"; most compatible servers only know it.
        host = urlsplit(self.base_url(deployment)).hostname
        return "max_completion_tokens" if host == "api.openai.com" else "max_tokens"

    def _shape(self, deployment: Deployment) -> tuple[str, str]:
        """(model name, max-tokens field) for a deployment, worked out once, not per request."""
        cached = self._shapes.get(id(deployment))
        if cached is None or cached[0] is not deployment:
            cached = (deployment, deployment.model_name, self._max_tokens_field(deployment))
            self._shapes[id(deployment)] = cached
        return cached[1], cached[2]

    def build_body(self, request: Request, deployment: Deployment) -> dict[str, Any]:
        model, cap_field = self._shape(deployment)
        body: dict[str, Any] = {"model": model, "messages": list(request.messages)}
        if request.max_tokens is not None:
            body[cap_field] = request.max_tokens
        if request.temperature is not None:
            body["temperature"] = request.temperature
        body.update(request.params)
        if deployment.tier == "flex":  # half price, slower, may be refused for capacity (a 429)
            body["service_tier"] = "flex"
        return body

    # -- the Responses API ----------------------------------------------------------------

    def speaks(self, deployment: Deployment) -> str | None:
        """``"responses"`` for a deployment that serves OpenAI's Responses API: as its
        ``options.responses`` says; by default one written ``openai/...`` or ``azure/...``
        (both serve it), not a bare model name (on a base_url: vLLM and the other
        compatible servers, most of which have Chat Completions only)."""
        configured = deployment.options.get("responses")
        if configured is None:
            configured = deployment.model.startswith(("openai/", "azure/"))
        return "responses" if configured else None

    def responses_url(self, deployment: Deployment) -> str:
        """``{base_url}/responses``."""
        return self._endpoint_for(deployment)[0].removesuffix("/chat/completions") + "/responses"

    def native_body(self, request: Request, deployment: Deployment) -> dict[str, Any]:
        body = super().native_body(request, deployment)
        if deployment.tier == "flex":  # as build_body asks for it
            body["service_tier"] = "flex"
        return body

    def url_of(self, request: Request, deployment: Deployment) -> str:
        if self.api_of(request, deployment) == "responses":
            return self.responses_url(deployment)
        return super().url_of(request, deployment)

    def reply_parser(self, request: Request, deployment: Deployment) -> Callable[[Mapping[str, Any]], Reply]:
        if self.api_of(request, deployment) == "responses":
            from ._responses import responses_reply

            return responses_reply
        return self.parse_reply

    def decoder_of(self, request: Request, deployment: Deployment, request_id: str | None) -> StreamDecoder:
        if self.api_of(request, deployment) == "responses":
            from ._responses import ResponsesStreamDecoder

            return ResponsesStreamDecoder(deployment.label, request_id)
        return self.stream_decoder(deployment, request_id)

    # -- Chat Completions -------------------------------------------------------------------

    def parse_reply(self, body: Mapping[str, Any]) -> Reply:
        """A chat completion; or a Response (a ``/v1/responses`` batch line's result)."""
        if body.get("object") == "response":
            from ._responses import responses_reply

            return responses_reply(body)
        choices = body.get("choices")
        # ``type(x) is dict`` first: the answer is orjson's dicts, and an ABC check costs ~0.2 µs
        choice = choices[0] if isinstance(choices, list) and choices else None
        if not (type(choice) is dict or isinstance(choice, Mapping)):
            raise MalformedResponseError("response has no choices")
        message = choice.get("message")
        if not (type(message) is dict or isinstance(message, Mapping)):
            raise MalformedResponseError("response choice has no message")
        content = message.get("content")
        usage = body.get("usage")
        return make_reply(
            text=content if isinstance(content, str) else None,
            usage=openai_usage(usage) if type(usage) is dict or isinstance(usage, Mapping) else Usage(),
            finish_reason=choice.get("finish_reason"),
        )

    def stream_body(self, request: Request, deployment: Deployment) -> dict[str, Any]:
        body = super().stream_body(request, deployment)
        if self.api_of(request, deployment) == "responses":
            return body  # its stream always ends with the usage
        # without it the stream carries no usage, and the cost could only be guessed
        body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
        return body

    def stream_decoder(self, deployment: Deployment, request_id: str | None) -> StreamDecoder:
        return OpenAIStreamDecoder(deployment.label, request_id)

    def parse_error(self, body: Any) -> tuple[str, str | None]:
        error = body.get("error") if isinstance(body, Mapping) else None
        if isinstance(error, Mapping):
            code = error.get("code") or error.get("type")
            return str(error.get("message") or "error"), str(code) if code else None
        if isinstance(error, str):
            return error, None
        return str(body)[:200], None

    # -- embeddings (POST {base_url}/embeddings; see ._embed) ---------------------------------

    def embeddings_url(self, deployment: Deployment) -> str:
        return f"{self.base_url(deployment)}/embeddings"

    def embedding_encoding(self, deployment: Deployment) -> str:
        """``base64`` for OpenAI itself (smaller, no float parsing); other servers get
        ``float`` unless ``options["embedding_encoding"]`` says they know base64."""
        configured = deployment.options.get("embedding_encoding")
        if configured in ("float", "base64"):
            return str(configured)
        return "base64" if urlsplit(self.base_url(deployment)).hostname == "api.openai.com" else "float"

    def takes_token_arrays(self, deployment: Deployment) -> bool:
        """OpenAI's API takes token arrays as input; a compatible server that knows only
        text has ``options["embed_token_arrays"] = false``."""
        return deployment.options.get("embed_token_arrays", True) is not False

    async def embed_batch(
        self,
        texts: Sequence[EmbedInput],
        deployment: Deployment,
        *,
        params: Mapping[str, Any],
        idempotency_key: str | None = None,
    ) -> EmbedReply:
        """One ``POST .../embeddings`` carrying every text of ``texts``."""
        url = self.embeddings_url(deployment)
        encoding = self.embedding_encoding(deployment)
        from ._embed import post_embeddings

        return await post_embeddings(
            self, url, texts, deployment, params, encoding=encoding, idempotency_key=idempotency_key
        )

    def parse_ratelimit(self, headers: Mapping[str, str]) -> RateLimitSnapshot | None:
        if "x-ratelimit-remaining-requests" not in headers and "x-ratelimit-remaining-tokens" not in headers:
            return None
        return make_snapshot(
            limit_requests=header_number(headers, "x-ratelimit-limit-requests"),
            remaining_requests=header_number(headers, "x-ratelimit-remaining-requests"),
            reset_requests=parse_openai_duration(headers.get("x-ratelimit-reset-requests")),
            limit_tokens=header_number(headers, "x-ratelimit-limit-tokens"),
            remaining_tokens=header_number(headers, "x-ratelimit-remaining-tokens"),
            reset_tokens=parse_openai_duration(headers.get("x-ratelimit-reset-tokens")),
            # OpenAI's limits and remaining counts are per minute (RPM, TPM), whatever
            # window the deployment is configured in; the limiter converts them.
            requests_window=60.0,
            tokens_window=60.0,
        )


class AzureOpenAIProvider(OpenAIProvider):
    """Azure OpenAI: ``{endpoint}/openai/deployments/{model}/chat/completions?api-version=``."""

    name = "azure"
    key_env = "AZURE_OPENAI_API_KEY"
    base_url_env = "AZURE_OPENAI_ENDPOINT"
    default_api_version = "2024-10-21"

    def endpoint(self, deployment: Deployment) -> tuple[str, dict[str, str]]:
        base = deployment.base_url or os.environ.get(self.base_url_env)
        if not base:
            raise ConfigError(
                f"deployment {deployment.label!r}: Azure needs base_url (https://NAME.openai.azure.com) "
                f"or {self.base_url_env}"
            )
        version = str(
            deployment.options.get("api_version") or os.environ.get("OPENAI_API_VERSION") or self.default_api_version
        )
        key = resolve_key(deployment, self.key_env)
        if not key:
            raise ConfigError(missing_key_message(deployment, self.key_env))
        url = f"{base.rstrip('/')}/openai/deployments/{deployment.model_name}/chat/completions?api-version={version}"
        return url, {"api-key": key.get()}

    def _max_tokens_field(self, deployment: Deployment) -> str:
        configured = deployment.options.get("max_tokens_field")
        return configured if isinstance(configured, str) else "max_tokens"

    def responses_url(self, deployment: Deployment) -> str:
        """``{endpoint}/openai/v1/responses``: Azure serves the Responses API in its v1 API,
        which takes no api-version (the body's model names the Azure deployment)."""
        chat_url, _ = self._endpoint_for(deployment)
        return f"{chat_url.partition('/openai/deployments/')[0]}/openai/v1/responses"

    def embeddings_url(self, deployment: Deployment) -> str:
        """``{endpoint}/openai/deployments/{model}/embeddings?api-version=``."""
        chat_url, _ = self._endpoint_for(deployment)
        base, _, query = chat_url.partition("?")
        return f"{base.removesuffix('/chat/completions')}/embeddings?{query}"

    def embedding_encoding(self, deployment: Deployment) -> str:
        configured = deployment.options.get("embedding_encoding")
        return str(configured) if configured in ("float", "base64") else "base64"
