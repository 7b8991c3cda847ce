"""Pointing sluice at the fake provider (:class:`sluice.testing.FakeServer`), or at nothing."""

from __future__ import annotations

import socket
from typing import Any

from sluice import Deployment
from sluice.testing import FakeServer


def deployment_at(server: FakeServer, model: str = "openai/gpt-test", **settings: Any) -> Deployment:
    """A deployment of ``model`` that sends to ``server`` (its Anthropic endpoint for an
    ``anthropic/`` model) with the key the server requires; ``settings`` are the
    Deployment's own (``name``, ``rpm``, ``price``, another ``api_key``...)."""
    settings.setdefault("api_key", server.api_key or "sk-test")
    base_url = server.anthropic_url if model.startswith("anthropic/") else server.url
    return Deployment(model, base_url=base_url, **settings)


def dead_url() -> str:
    """An OpenAI-style base URL on loopback where nothing listens (a port bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"
