"""What the server's parts share through the aiohttp application and request.

The chat/embeddings/metrics side (``_app``) and the Batch API side (``batches._batches``) are
written apart; this is their whole contract:

* ``app[ENGINE]`` — the one running :class:`~sluice.Engine` every request goes through
  (interactive requests at ``Priority.INTERACTIVE``, batch work at ``Priority.BATCH``, so
  a client's chat overtakes queued batch lines);
* ``app[BATCH_ENGINE]`` (optional) — the engine chat batches run on when they go through
  the provider's Batch API (``[serve] batch_tier = "batch"``): its own gate (a line waits
  there for hours), the same store and the same money (``Engine(spending=...)``);
* ``app[STATE_DIR]`` — the directory the server keeps its state in (client spend,
  uploaded files, batches in progress), so a restart resumes;
* ``request[CLIENT]`` — the authenticated client (:class:`ClientLike`), set by the auth
  middleware before any handler runs; without ``[[client]]`` entries it is the one
  anonymous loopback client named ``"default"``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from aiohttp import web

if TYPE_CHECKING:
    from ..._budget import Budget
    from ..._engine import Engine

__all__ = ["BATCH_ENGINE", "CLIENT", "ENGINE", "STATE_DIR", "ClientLike"]


class ClientLike(Protocol):
    """Who is calling: files and batches belong to a client, and its spend counts against its budget."""

    @property
    def name(self) -> str: ...

    @property
    def budget(self) -> Budget | None: ...


ENGINE: web.AppKey[Engine] = web.AppKey("sluice.engine")
BATCH_ENGINE: web.AppKey[Engine] = web.AppKey("sluice.batch_engine")
STATE_DIR: web.AppKey[Path] = web.AppKey("sluice.state_dir", Path)
#: ``request[CLIENT]`` holds a :class:`ClientLike` (a RequestKey, not a str: aiohttp
#: warns about str keys in a request's storage, and tests run with warnings as errors).
CLIENT: web.RequestKey[ClientLike] = web.RequestKey("sluice.client")
