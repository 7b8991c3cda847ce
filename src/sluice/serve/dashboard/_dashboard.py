"""``/dashboard``: the server's live state in a browser, for its operator.

Routes: ``GET /dashboard`` (the page: one HTML document, its script and style inline, no
request anywhere but ``/dashboard/data``), ``GET /dashboard/data`` (the JSON it polls, see
:mod:`._live`), ``POST /dashboard/login`` and ``POST /dashboard/logout``.

Who may look:

* ``[serve] admin_key_env = "NAME"``: the admin key in ``$NAME`` (16 characters or more,
  no client's key). A script sends ``Authorization: Bearer <admin key>``; a browser logs
  in with a form (POSTed, so the key never sits in a URL, the history or an access log)
  and gets a session cookie: ``<expiry>.<nonce>.<HMAC>`` under a secret derived from the
  key, ``HttpOnly``, ``SameSite=Strict``, ``Path=/dashboard``, 12 hours. The cookie holds no
  key, works on every replica with the same key, and changing the key ends every session.
  Logging out revokes the cookie's nonce in this process (another replica, or this one
  after a restart, takes it until it expires). Without credentials: 401 (the page: a login
  form); a client's key: 403. A key or cookie that is not ASCII is a 401 (never a 500).
  Wrong keys (by form or header) back off per address (``_backoff``): past a few, the
  next is not checked until a doubling wait is over (429 with ``Retry-After``).
* No admin key and no ``[[client]]``: the server listens on loopback only and asks nobody
  for a key, so the dashboard answers requests from loopback (403 from anywhere else).
* No admin key but client keys: the dashboard is off (404 saying how to turn it on):
  a client's key must never be enough, and a reverse proxy on the same machine would make
  a "loopback only" rule open to everyone.

Every answer carries ``Cache-Control: no-store`` and a Content-Security-Policy that allows
only the page's own inline script and style (by hash) and requests to its own origin.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import html
import ipaddress
import re
import secrets
import time
from collections.abc import Mapping
from importlib import resources
from urllib.parse import parse_qs

from aiohttp import web

from ..core._body import read_body
from ..core._clients import Clients
from ..core._errors import openai_error
from ..core._key_rules import bearer, operator_key, same_key
from ..core._settings import ServeSettings
from ._backoff import Backoff, retry_after
from ._live import Live

__all__ = ["BACKOFF", "DASHBOARD", "LIVE", "DashboardAuth", "is_dashboard", "setup_dashboard"]

DASHBOARD = "/dashboard"
COOKIE = "sluice_dashboard"
SESSION_S = 12 * 3600
#: The login form's largest body (a key and its field name).
_MAX_FORM = 4096
#: The most logged-out sessions remembered (the oldest is forgotten first; each expires anyway).
_MAX_REVOKED = 4096

LIVE: web.AppKey[Live] = web.AppKey("sluice.dashboard.live", Live)
_AUTH: web.AppKey[DashboardAuth] = web.AppKey("sluice.dashboard.auth")
#: ``app[BACKOFF]``: the wrong admin keys per address (see ``_backoff``).
BACKOFF: web.AppKey[Backoff] = web.AppKey("sluice.dashboard.backoff", Backoff)


def is_dashboard(path: str) -> bool:
    return path == DASHBOARD or path.startswith(DASHBOARD + "/")


class DashboardAuth:
    """Who may see the dashboard (see the module docstring); holds digests, never the key."""

    __slots__ = ("_digest", "_revoked", "_secret", "backoff", "clients")

    def __init__(self, admin_key: str | None, clients: Clients) -> None:
        self.clients = clients
        #: Wrong keys per remote address (the login form and a Bearer header alike).
        self.backoff = Backoff()
        #: Nonces of the sessions logged out here, with their expiry (oldest first).
        self._revoked: dict[str, int] = {}
        self._digest = hashlib.sha256(admin_key.encode()).digest() if admin_key else None
        #: The sessions' HMAC key: derived, so a cookie is worth nothing without the admin key.
        self._secret = hmac.new(admin_key.encode(), b"sluice dashboard", "sha256").digest() if admin_key else b""

    @classmethod
    def from_settings(
        cls, settings: ServeSettings, clients: Clients, environ: Mapping[str, str] | None = None
    ) -> DashboardAuth:
        """Read the admin key from its variable; a ConfigError when it is unset, short, or a client's."""
        return cls(operator_key(settings.admin_key_env, "admin", clients, environ), clients)

    @property
    def keyed(self) -> bool:
        """Whether an admin key is configured."""
        return self._digest is not None

    @property
    def on(self) -> bool:
        """Whether the dashboard is served at all."""
        return self._digest is not None or self.clients.anonymous

    def verdict(self, request: web.Request, key: str | None = None) -> int:
        """200 (may look), 401 (no or wrong credentials), 403 (a client's key, or not
        loopback without an admin key), 404 (off) or 429 (too many wrong keys from this
        address lately: the key is not checked). ``key``: one typed into the login form."""
        if self._digest is None:
            if not self.clients.anonymous:
                return 404
            return 200 if _loopback(request.remote) else 403
        if key is None:
            key = bearer(request)
        if key:
            if self.backoff.wait(request.remote) > 0:  # too many wrong keys from there: not even checked
                return 429
            if same_key(key, self._digest):  # a key that is not ASCII is nobody's: a 401
                self.backoff.succeeded(request.remote)
                return 200
            if not self.clients.anonymous and self.clients.authenticate(key) is not None:
                return 403  # a client's key: not a guess (those can be tried on /v1 as well)
            self.backoff.failed(request.remote)
            return 401
        cookie = request.cookies.get(COOKIE)
        return 200 if cookie is not None and self._valid(cookie) else 401

    def session(self, now: float | None = None) -> str:
        """A new session cookie's value (expiry, nonce, their HMAC)."""
        expires = int((time.time() if now is None else now) + SESSION_S)
        body = f"{expires}.{secrets.token_urlsafe(12)}"
        return f"{body}.{self._sign(body)}"

    def revoke(self, token: str | None) -> None:
        """Log a session out: its cookie is refused by this process from now on."""
        found = self._parse(token)
        if found is None:
            return
        now = time.time()
        for nonce, expires in list(self._revoked.items()):  # the expired ones are refused anyway
            if expires >= now and len(self._revoked) < _MAX_REVOKED:
                break
            del self._revoked[nonce]
        self._revoked[found[1]] = found[0]

    def _valid(self, token: str) -> bool:
        found = self._parse(token)
        return found is not None and found[1] not in self._revoked

    def _parse(self, token: str | None) -> tuple[int, str] | None:
        """A signed, unexpired session cookie's expiry and nonce; None for anything else."""
        if token is None or len(token) > 200 or not token.isascii():
            return None
        body, _, signature = token.rpartition(".")
        expires, _, nonce = body.partition(".")
        if not body or not expires.isdigit() or len(expires) > 12 or int(expires) < time.time():
            return None
        if not hmac.compare_digest(signature.encode(), self._sign(body).encode()):
            return None
        return int(expires), nonce

    def _sign(self, body: str) -> str:
        digest = hmac.new(self._secret, body.encode(), "sha256").digest()
        return base64.urlsafe_b64encode(digest).decode().rstrip("=")


# -- the documents ---------------------------------------------------------------------------------


def _document(name: str) -> str:
    return resources.files(__package__ or "sluice.serve.dashboard").joinpath(name).read_text(encoding="utf-8")


def _policy(*documents: str) -> str:
    """The CSP of the pages: their inline ``<script>`` and ``<style>`` by hash, nothing else."""

    def hashes(tag: str) -> str:
        found = {
            "'sha256-" + base64.b64encode(hashlib.sha256(body.encode()).digest()).decode() + "'"
            for document in documents
            for body in re.findall(rf"<{tag}>(.*?)</{tag}>", document, re.DOTALL)
        }
        return " ".join(sorted(found)) or "'none'"

    return (
        f"default-src 'none'; script-src {hashes('script')}; style-src {hashes('style')}; img-src data:; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    )


_PAGE = _document("dashboard.html")
_LOGIN = _document("dashboard_login.html")
_HEADERS = {
    "cache-control": "no-store",
    "content-security-policy": _policy(_PAGE, _LOGIN),
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "no-referrer",
}

_SAY = {
    401: "Log in with the admin key.",
    403: "That is a client's key: the dashboard takes the admin key ([serve] admin_key_env).",
    404: "The dashboard is off: this server has client keys but no admin key. "
    'Set [serve] admin_key_env = "NAME" and the admin key in $NAME.',
}


def _page(status: int, body: str) -> web.Response:
    response = web.Response(status=status, text=body, content_type="text/html", charset="utf-8", headers=_HEADERS)
    if status == 401:
        response.headers["www-authenticate"] = 'Bearer realm="sluice dashboard"'
    return response


def _login_page(status: int, message: str, *, error: bool = True) -> web.Response:
    """The login form; ``message`` in red only when ``error`` (an attempt failed), else
    as the form's plain prompt."""
    body = _LOGIN.replace("{action}", f"{DASHBOARD}/login").replace("{kind}", "error" if error else "prompt")
    return _page(status, body.replace("{message}", html.escape(message)))


def _refused(request: web.Request, status: int, *, as_json: bool) -> web.Response:
    if status == 429:
        return _throttled(request, as_json=as_json)
    if status == 403 and not request.app[_AUTH].keyed:
        message = "Without an admin key ([serve] admin_key_env) the dashboard answers only on this machine (loopback)."
    else:
        message = _SAY[status]
    if as_json:
        response = openai_error(status, message, code="dashboard_" + ("unauthorized" if status == 401 else "refused"))
        response.headers.update(_HEADERS)
        return response
    if status == 404:
        return _page(404, f"<!doctype html><title>sluice serve</title><p>{html.escape(message)}</p>")
    return _login_page(status, message, error=status != 401)  # 401: no key tried yet, the prompt


def _throttled(request: web.Request, *, as_json: bool) -> web.Response:
    """A 429 with ``Retry-After``: this address sent too many wrong keys lately."""
    wait = retry_after(request.app[_AUTH].backoff.wait(request.remote))
    message = f"Too many wrong keys from this address; the next one is checked in {wait} s."
    if as_json:
        response = openai_error(429, message, code="dashboard_throttled")
        response.headers.update(_HEADERS)
    else:
        response = _login_page(429, message)
    response.headers["retry-after"] = wait
    return response


# -- the handlers ------------------------------------------------------------------------------------


async def _dashboard(request: web.Request) -> web.Response:
    if request.path != DASHBOARD:
        raise web.HTTPFound(DASHBOARD)  # /dashboard/: the page's relative links need the one path
    status = request.app[_AUTH].verdict(request)
    return _page(200, _PAGE) if status == 200 else _refused(request, status, as_json=False)


async def _data(request: web.Request) -> web.Response:
    status = request.app[_AUTH].verdict(request)
    if status != 200:
        return _refused(request, status, as_json=True)
    return web.Response(body=request.app[LIVE].data(), content_type="application/json", headers=_HEADERS)


async def _login(request: web.Request) -> web.Response:
    auth = request.app[_AUTH]
    if not auth.keyed:
        return _refused(request, 404 if not auth.on else 403, as_json=False)
    # never more than the form can hold: anyone may post here, and max_body_mb a time is not free
    too_large = request.content_length is not None and request.content_length > _MAX_FORM
    body = b"" if too_large else await read_body(request, limit=_MAX_FORM)
    if too_large or len(body) > _MAX_FORM:
        response = _login_page(413, "That form is too large.")
        response.force_close()  # the rest of the body is not read
        return response
    keys = parse_qs(body.decode("utf-8", "replace")).get("key", [])
    status = auth.verdict(request, keys[0]) if len(keys) == 1 and keys[0] else 401
    if status != 200:
        return _refused(request, status, as_json=False) if status != 401 else _login_page(401, "Wrong key.")
    response = web.HTTPSeeOther(DASHBOARD, headers=_HEADERS)
    cookie = auth.session()
    response.set_cookie(
        COOKIE, cookie, max_age=SESSION_S, path=DASHBOARD, httponly=True, samesite="Strict", secure=request.secure
    )
    raise response


async def _logout(request: web.Request) -> web.Response:
    request.app[_AUTH].revoke(request.cookies.get(COOKIE))
    response = web.HTTPSeeOther(DASHBOARD, headers=_HEADERS)
    response.del_cookie(COOKIE, path=DASHBOARD)
    raise response


def setup_dashboard(app: web.Application, auth: DashboardAuth, live: Live) -> None:
    """Add the routes, and sample while the app runs (nothing when the dashboard is off)."""
    app[_AUTH] = auth
    app[BACKOFF] = auth.backoff
    app.router.add_get(DASHBOARD, _dashboard)
    app.router.add_get(DASHBOARD + "/", _dashboard)
    app.router.add_get(DASHBOARD + "/data", _data)
    app.router.add_post(DASHBOARD + "/login", _login)
    app.router.add_post(DASHBOARD + "/logout", _logout)
    if not auth.on:
        return
    app[LIVE] = live
    tasks: list[asyncio.Task[None]] = []

    async def start(app: web.Application) -> None:
        tasks.append(asyncio.create_task(live.run()))

    async def stop(app: web.Application) -> None:
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    app.on_startup.append(start)
    app.on_cleanup.insert(0, stop)


def _loopback(remote: str | None) -> bool:
    try:
        return remote is not None and ipaddress.ip_address(remote).is_loopback
    except ValueError:
        return False
