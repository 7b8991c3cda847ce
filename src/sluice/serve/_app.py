"""The ``sluice serve`` application: one engine, many clients, OpenAI's API.

:func:`build_app` makes the aiohttp application from a parsed config; :func:`make_runner`
runs it with the server-level guards (the header timeout); :func:`serve` is what the CLI
runs. The middlewares, outermost first (with ``--otel``, the SERVER span's: ended by one
before them all, started by one after auth, so an unauthenticated caller gets none):

* **errors**: whatever goes wrong becomes OpenAI's error JSON (aiohttp's own 404/405/413
  included); an unexpected exception is logged and answered 500 with nothing of its text;
* **plain body**: a compressed request body (``Content-Encoding``) is a 415, never inflated;
* **auth**: ``Authorization: Bearer <key>`` names the client (``request[CLIENT]``); a
  wrong or missing key is a 401 ``invalid_api_key``. Without ``[[client]]`` everyone is
  ``default`` (the server then listens on loopback only). ``/health`` needs no key: it
  says nothing of any client; ``/metrics`` asks for the metrics key itself when
  ``[serve] metrics_key_env`` names one, and ``/dashboard`` for the admin key (see
  ``dashboard._dashboard``);
* **forward** (with ``--redis`` only): a file or batch held by another replica is answered
  by that replica (see ``_forward``; the registry of replicas: ``core._replicas``).

Hostile clients: bodies are capped (``client_max_size``, 413; a JSON body's values and the
bytes parsed at once too: :class:`~sluice.serve.core._body.BodyLimits`), a body must arrive within
``body_timeout_s`` of the headers (:func:`read_body`, 408 and the connection closed), and
the headers within ``header_timeout_s`` of the connection (or of the previous response):
aiohttp closes a connection whose request has not fully arrived when its keep-alive
timer fires, so the timer doubles as the header timeout (see :func:`make_runner`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import hashlib
import logging
import signal
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web
from aiohttp.typedefs import Middleware

from .._config import JobConfig, engine_from
from .._errors import ConfigError, SluiceError
from .._limits import Limiter
from .._model_names import model_names
from .._models import Deployment
from ..store import SqliteStore
from ..tiers import BatchSettings, close_tiers
from ._access_log import AccessLogger
from ._forward import forward_middleware
from .batches._batches import Limits, recent_batches, setup_batch_api
from .chat._chat import chat_completions
from .core._batch_money import batch_spend
from .core._body import BODY_LIMITS, BODY_TIMEOUT, BodyLimits, BodyTimeout, read_body, read_json, timed_out
from .core._body_budget import BodyBudget
from .core._clients import Client, Clients, SpendStore
from .core._context import CONTEXT, JSON_BODY, BadBody, Refused, ServeContext, client_of, upstream_secrets
from .core._errors import openai_error
from .core._key_rules import bearer, operator_key, same_key
from .core._keys import BATCH_ENGINE, CLIENT, ENGINE, STATE_DIR, ClientLike
from .core._metrics import CONTENT_TYPE, Metrics
from .core._prompt_cache import ServePromptCache
from .core._queue import Admission, serve_limiter
from .core._replicas import REPLICAS, Replicas
from .core._settings import ClientSpec, ServeSettings
from .dashboard._dashboard import DashboardAuth, is_dashboard, setup_dashboard
from .dashboard._live import RECENT, Live, Recent
from .embeddings._embeddings import embeddings
from .message_batches._message_batches import add_message_batch_routes
from .messages._anthropic import anthropic_model, anthropic_shaped, from_anthropic_client
from .messages._messages import count_tokens, messages
from .responses._db import ResponsesDB
from .responses._responses import add_responses_routes

if TYPE_CHECKING:
    from .._engine import Engine, RetryEvent
    from .core._redis import ServeRedis

__all__ = ["BODY_TIMEOUT", "build_app", "make_runner", "read_body", "serve"]

_log = logging.getLogger("sluice.serve")

#: ``app[SETTINGS]``: the ``[serve]`` table the app was built with.
SETTINGS: web.AppKey[ServeSettings] = web.AppKey("sluice.serve.settings", ServeSettings)

#: ``app[_METRICS_KEY]``: the SHA-256 of the key ``/metrics`` asks for (absent: it asks none).
_METRICS_KEY: web.AppKey[bytes] = web.AppKey("sluice.serve.metrics_key", bytes)

#: How often client spend is written even when no request of ours finished (batch work).
_SAVE_EVERY = 2.0
#: Seconds the rest of a refused body is read before the connection closes.
_LINGER = 2.0
_OPEN_PATHS = frozenset({"/health", "/metrics"})

#: Who a refusal is counted against before the auth middleware named anyone.
_NOBODY = Client("-")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def build_app(
    config: JobConfig,
    settings: ServeSettings,
    clients: Sequence[ClientSpec],
    state_dir: Path,
    *,
    environ: Mapping[str, str] | None = None,
    redis_url: str | None = None,
    redis_fail_open: bool = False,
    advertise_url: str | None = None,
) -> web.Application:
    """The application: its engine is made here and started/closed with the app.

    ``redis_url``: share the deployments' limits, the budgets and client spend and rpm/tpm
    with every replica that names the same Redis (see ``core._redis``); files and batches stay in
    this replica's state dir, but any replica answers for them (see ``core._replicas``).
    ``advertise_url``: where the other replicas reach this one (default: the address it
    listens on, set by :func:`serve`, or by the caller through ``app[REPLICAS].set_address``).

    Raises ConfigError for a client whose key variable is unset (or keys shared)."""
    names = model_names(config.deployments)
    for spec in clients:
        unknown = sorted(set(spec.models or ()) - set(names))
        if unknown:
            raise ConfigError(
                f"client {spec.name!r}: models names {unknown}, which no [[deployment]] serves; known: {sorted(names)}"
            )
    state_dir.mkdir(parents=True, exist_ok=True)
    config = dataclasses.replace(config, prompt_cache=settings.prompt_cache)  # clients' batches too
    middlewares: list[Middleware] = [_errors, _plain_body, _auth]
    if config.tracing is not None:  # --otel: a SERVER span per authenticated API request (opentelemetry only then)
        from ._tracing import server_spans

        ends, starts = server_spans(config.tracing)
        middlewares = [ends, *middlewares, starts]
    if redis_url is not None:
        middlewares.append(forward_middleware)  # after auth: it needs the client's name
    app = web.Application(client_max_size=settings.max_body_bytes, middlewares=middlewares)
    store = SqliteStore(state_dir / "engine.db")
    metrics_box: list[Metrics] = []
    recent = Recent()  # the dashboard's last errors
    spend_box: list[Clients] = []  # set once the clients are known, if any of them has a budget

    def save_spend() -> None:
        if spend_box:
            _save_spend(spend_box[0])

    redis: ServeRedis | None = None
    if redis_url is not None:
        try:
            from .core._redis import ServeRedis
        except ImportError as exc:
            raise ConfigError(f"--redis needs the redis extra: pip install 'llm-sluice[redis]' ({exc})") from None
        redis = ServeRedis(redis_url, fail_open=redis_fail_open)

    def limiter_factory(deployment: Deployment) -> Limiter:
        if redis is not None:
            return redis.limiter_factory(deployment)  # the truth is Redis: nothing to save locally
        limiter = serve_limiter(deployment)
        limiter.on_grant = save_spend
        return limiter

    engine = engine_from(
        config,
        store=store,
        limiter_factory=limiter_factory,
        shared_budget=redis.engine_budget(config.budget_usd) if redis is not None else None,
        on_retry=lambda event: _retried(event, metrics_box, recent),
    )
    batch_engine = None
    if settings.batch_tier == "batch":  # chat batches through the provider's Batch API
        tiered = dataclasses.replace(config, tier="batch", batch=BatchSettings(poll_every=settings.batch_poll_every))
        batch_engine = engine_from(tiered, store=store, spending=engine.spending)
    spend = SpendStore(state_dir / "clients.db")
    responses = ResponsesDB(
        state_dir / "responses.db",
        ttl_s=settings.responses_ttl_days * 86400.0,
        max_bytes=int(settings.responses_mb_per_client * 1024 * 1024),
    )
    try:
        spent = batch_spend(store, spend.noted_batches()) if redis is None else None
        registry = Clients.from_specs(clients, engine, spend, environ, redis, spent)
        auth = DashboardAuth.from_settings(settings, registry, environ)  # its key: unset, short or a client's
        metrics_key = operator_key(settings.metrics_key_env, "metrics", registry, environ)
    except BaseException:
        responses.close()
        spend.close()
        store.close()
        raise
    budgeted = registry.engine_budget is not None or any(c.budget is not None for c in registry.by_name.values())
    if redis is None and budgeted:
        spend_box.append(registry)
    admission = Admission(settings.max_queue, settings.max_wait_s)
    metrics = Metrics(
        engine, lambda: admission.waiting, redis.client_spend if redis is not None else registry.client_spend
    )
    metrics_box.append(metrics)
    ctx = ServeContext(
        engine=engine,
        clients=registry,
        settings=settings,
        admission=admission,
        metrics=metrics,
        models=names,
        secrets=upstream_secrets(config.deployments),
        redis=redis,
        prompt_cache=ServePromptCache(engine, metrics, on=settings.prompt_cache == "auto"),
    )
    app[ENGINE] = engine
    if batch_engine is not None:
        app[BATCH_ENGINE] = batch_engine
    app[STATE_DIR] = state_dir
    app[CONTEXT] = ctx
    app[SETTINGS] = settings
    if metrics_key is not None:
        app[_METRICS_KEY] = hashlib.sha256(metrics_key.encode()).digest()
    app[BODY_TIMEOUT] = settings.body_timeout_s
    app[BODY_LIMITS] = BodyLimits(
        settings.max_body_bytes,
        settings.max_json_values,
        BodyBudget(*settings.parse_budget_bytes),
        settings.max_wait_s,
    )
    start, close = _lifetime(ctx, store, spend, batch_engine, responses)
    app.on_startup.append(start)  # before the Batch API's hooks: its batches resume on a started engine
    setup_batch_api(
        app,
        limits=Limits(
            client_file_bytes=int(settings.client_files_mb * 1024 * 1024),
            client_files=settings.client_files,
            file_ttl_s=settings.file_ttl_days * 24 * 3600,
            client_uploads=settings.client_uploads,
            upload_timeout_s=settings.upload_timeout_s,
            max_values=settings.max_json_values,
        ),
        client_named=registry.by_name.get,
        resolve_model=functools.partial(_batch_model, ctx),
        validate_json=settings.validate_json,
    )
    add_message_batch_routes(app)  # Anthropic's Message Batches, on the Batch API's state and runs
    app.on_cleanup.append(close)  # after them: batches stop feeding and record what is in flight first
    if redis_url is not None:
        replicas = Replicas(redis_url, state_dir, advertise_url)
        app[REPLICAS] = replicas
        app.on_startup.append(replicas.start)
        app.on_cleanup.insert(0, replicas.close)  # first: stop answering for this replica's objects
    app.router.add_post("/v1/chat/completions", _json_handler(chat_completions))
    app.router.add_post("/v1/messages", _json_handler(messages))
    app.router.add_post("/v1/messages/count_tokens", _json_handler(count_tokens))
    add_responses_routes(app, responses, _json_handler)
    app.router.add_post("/v1/embeddings", _json_handler(embeddings))
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/v1/models/{model:.+}", retrieve_model)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics_handler)
    engines = [engine] if batch_engine is None else [engine, batch_engine]
    replicas_of = app.get(REPLICAS)
    live = Live(
        ctx,
        recent,
        engines=lambda: engines,
        client_spend=redis.client_spend if redis is not None else registry.client_spend,
        batches=functools.partial(recent_batches, app),
        replica=lambda: replicas_of.address if replicas_of is not None else None,
    )
    setup_dashboard(app, auth, live)
    if auth.on:
        app[RECENT] = recent
    return app


def _retried(event: RetryEvent, metrics: list[Metrics], recent: Recent) -> None:
    """``Engine(on_retry=...)``: the retry counted for /metrics and noted for the dashboard."""
    if metrics:
        metrics[0].retry(event)
    recent.retried(event)


def _lifetime(
    ctx: ServeContext,
    store: SqliteStore,
    spend: SpendStore,
    batch_engine: Engine | None = None,
    responses: ResponsesDB | None = None,
) -> tuple[Callable[[web.Application], Awaitable[None]], Callable[[web.Application], Awaitable[None]]]:
    """The engine's start and close (plain hooks, not a cleanup context: aiohttp runs every
    cleanup context before the other cleanup hooks, and the engine must close last)."""
    saver: list[asyncio.Task[None]] = []

    async def start(app: web.Application) -> None:
        await ctx.engine.start()
        if batch_engine is not None:
            await batch_engine.start()
        keep = _refresh_often(ctx.redis) if ctx.redis is not None else _save_often(ctx.clients)
        saver.append(asyncio.create_task(keep))

    async def close(app: web.Application) -> None:
        for task in saver:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        try:
            if batch_engine is not None:
                try:
                    await batch_engine.close()
                finally:
                    await close_tiers(batch_engine.deployments)  # the provider's batches run on
            await ctx.engine.close()
        finally:
            try:
                if ctx.redis is not None:
                    await ctx.redis.close()
                else:
                    ctx.clients.save()
            finally:
                if responses is not None:
                    responses.close()
                spend.close()
                store.close()

    return start, close


def _batch_model(ctx: ServeContext, client: ClientLike, model: str) -> str | None:
    """A batch line's model as the engine knows it, if its client may use it (the same
    check as an interactive request's: ``models`` holds for batches too)."""
    known = ctx.clients.by_name.get(client.name)
    if known is None:  # no longer configured: nobody may run it
        return None
    try:
        return ctx.resolve(known, model)
    except (Refused, BadBody):
        return None


def _save_spend(clients: Clients) -> None:
    """Client spend on disk before a request is sent (a failed write must not stop the request)."""
    try:
        clients.save()
    except SluiceError:
        _log.exception("sluice serve: cannot write client spend; retrying with the next request")


async def _save_often(clients: Clients) -> None:
    while True:
        await asyncio.sleep(_SAVE_EVERY)
        try:
            clients.save()
        except Exception:
            _log.exception("sluice serve: cannot write client spend; retrying")


async def _refresh_often(redis: ServeRedis) -> None:
    """With --redis: the clients' spend as every replica counts it, for /metrics."""
    while True:
        try:
            await redis.client_totals()
        except SluiceError:
            pass  # Redis down: said by /health and the refusals; the last figures stay
        except Exception:
            _log.exception("sluice serve: cannot read the clients' spend from Redis; retrying")
        await asyncio.sleep(_SAVE_EVERY)


def _json_handler(handler: Handler) -> Handler:
    """Read the body as JSON (within the body timeout) before ``handler`` runs."""

    async def wrapped(request: web.Request) -> web.StreamResponse:
        request[JSON_BODY] = await read_json(request)
        return await handler(request)

    return wrapped


# -- middlewares ---------------------------------------------------------------------------------


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    ctx = request.app[CONTEXT]
    client = request.get(CLIENT)
    name = client.name if client is not None else "-"
    loop = asyncio.get_running_loop()
    began = loop.time()
    endpoint = _endpoint(request)
    response: web.StreamResponse
    try:
        response = await handler(request)
    except BadBody as exc:
        response = openai_error(400, exc.message, param=exc.param)
    except Refused as exc:
        response = exc.response
    except BodyTimeout:
        response = timed_out(request)
    except ConnectionResetError:  # the client went away mid-request: nobody to answer, nothing to log loudly
        _log.debug("sluice serve: %s %s: the client closed the connection", request.method, request.path)
        response = openai_error(400, "the connection was closed before the request arrived")
        response.force_close()
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        response = _http_error(request, exc)
    except SluiceError as exc:  # raised by the engine before anything was sent (a request it can never run)
        response = ctx.failure(request.get(CLIENT) or _NOBODY, exc)
    except Exception:
        _log.exception("sluice serve: internal error on %s %s", request.method, request.path)
        response = openai_error(500, "The server had an error while processing your request.", type="server_error")
    client = request.get(CLIENT)
    name = client.name if client is not None else name
    recent = request.app.get(RECENT)
    if recent is not None and response.status >= 400 and request.path.startswith("/v1/"):
        recent.answered(name if client is not None else None, response)
    if from_anthropic_client(request):
        response = anthropic_shaped(response)
    ctx.metrics.requests.labels(endpoint, name, str(response.status)).inc()
    ctx.metrics.duration.labels(endpoint, name).observe(loop.time() - began)
    return response


def _endpoint(request: web.Request) -> str:
    """The route's pattern (never the raw path: a scanner's junk would make labels without end)."""
    route = request.match_info.route
    resource = route.resource
    return resource.canonical if resource is not None else "other"


def _http_error(request: web.Request, exc: web.HTTPException) -> web.Response:
    if exc.status == 404:
        return openai_error(404, f"Invalid URL ({request.method} {request.path[:200]})")
    if exc.status == 405:
        return openai_error(405, f"Method not allowed ({request.method} {request.path[:200]})")
    if exc.status == 413:
        limit = request.app[SETTINGS].max_body_mb
        response = openai_error(413, f"the request body is larger than this server takes ({limit:g} MB)")
        response.force_close()  # the rest of the body is not read
        return response
    return openai_error(exc.status, exc.reason)


@web.middleware
async def _plain_body(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Refuse compressed request bodies: aiohttp would inflate them as they arrive, so a
    2 MB gzip bomb costs hundreds of MB before the size cap sees it; no OpenAI SDK sends one."""
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        response = openai_error(
            415, f"Content-Encoding {encoding[:40]!r} is not accepted for request bodies; send the body uncompressed"
        )
        response.force_close()  # its body is not read
        return response
    return await handler(request)


@web.middleware
async def _auth(request: web.Request, handler: Handler) -> web.StreamResponse:
    clients = request.app[CONTEXT].clients
    if request.path in _OPEN_PATHS or is_dashboard(request.path):  # the dashboard asks for its own key
        return await handler(request)
    header = request.headers.get("authorization", "")
    scheme, _, key = header.partition(" ")
    given: str | None = key.strip() if scheme.lower() == "bearer" else None
    if not header and "x-api-key" in request.headers:  # Anthropic's way of giving it
        given = request.headers["x-api-key"].strip()
    client = clients.authenticate(given)
    if client is None:
        if not header and "x-api-key" not in request.headers:
            how = "an x-api-key header, or" if from_anthropic_client(request) else "an"
            message = (
                f"You didn't provide an API key. You need to provide your API key in {how} Authorization header "
                "using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
            )
        else:
            message = "Incorrect API key provided. Ask the operator of this sluice server for your key."
        return openai_error(401, message, code="invalid_api_key")
    request[CLIENT] = client
    return await handler(request)


# -- small endpoints -------------------------------------------------------------------------------


def _model(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "sluice"}


async def list_models(request: web.Request) -> web.Response:
    """The models a client may use, in its API's shape (Anthropic's, when it speaks it)."""
    ctx = request.app[CONTEXT]
    names = ctx.visible_models(client_of(request))
    if from_anthropic_client(request):
        first, last = (names[0], names[-1]) if names else (None, None)
        listed = [anthropic_model(n) for n in names]
        return web.json_response({"data": listed, "has_more": False, "first_id": first, "last_id": last})
    return web.json_response({"object": "list", "data": [_model(n) for n in names]})


async def retrieve_model(request: web.Request) -> web.Response:
    ctx = request.app[CONTEXT]
    name = request.match_info["model"]
    ctx.resolve(client_of(request), name)  # a 404 for a model it may not use
    return web.json_response(anthropic_model(name) if from_anthropic_client(request) else _model(name))


async def health(request: web.Request) -> web.Response:
    ctx = request.app[CONTEXT]
    engine = ctx.engine
    deployments = [
        {
            "deployment": s.deployment,
            "model": s.model,
            "state": s.state,
            "seconds_left": round(s.seconds_left, 3),
            "in_flight": s.in_flight,
            "answered": s.answered,
            "failed": s.failed,
            "last_error": ctx.scrub(s.last_error) if s.last_error else None,
        }
        for s in engine.deployment_status()
    ]
    stopped = engine.store_error is not None
    body: dict[str, Any] = {
        "status": "stopped" if stopped else "ok",
        "deployments": deployments,
        "queue": {"waiting": ctx.admission.waiting, "max": ctx.admission.max_queue},
    }
    if ctx.redis is not None:
        problem = ctx.redis.problem
        if problem is None:  # asked (not shown: nothing of a client is anyone's to see here) as a check of Redis
            try:
                await asyncio.wait_for(ctx.redis.client_totals(), timeout=2.0)
            except (SluiceError, TimeoutError) as exc:
                problem = ctx.redis.problem or f"Redis did not answer: {type(exc).__name__}"
        body["redis"] = {"status": "ok" if problem is None else "down", "problem": problem}
        if problem is not None and not stopped:
            body["status"] = "redis_down"
            stopped = True
    return web.json_response(body, status=503 if stopped else 200)


async def metrics_handler(request: web.Request) -> web.Response:
    ctx = request.app[CONTEXT]
    digest = request.app.get(_METRICS_KEY)
    if digest is not None and not same_key(bearer(request), digest):
        return openai_error(
            401,
            "/metrics needs the metrics key ([serve] metrics_key_env) as Authorization: Bearer <key>",
            code="invalid_api_key",
            headers={"www-authenticate": 'Bearer realm="sluice metrics"'},
        )
    return web.Response(body=ctx.metrics.render(), headers={"content-type": CONTENT_TYPE})


# -- running ----------------------------------------------------------------------------------------


def make_runner(app: web.Application, *, access_log: bool = False) -> web.AppRunner:
    """A runner for ``app`` whose keep-alive timer is the header timeout: aiohttp arms it when
    a connection opens and after each response, and closes the connection if no complete
    request has arrived when it fires (slowloris)."""
    settings = app[SETTINGS]
    kwargs: dict[str, Any] = {
        "keepalive_timeout": settings.header_timeout_s,
        # after an early answer (408, 413) aiohttp reads what is left of the body for this
        # long (10 s by default) before closing: a trickling client must not keep it longer
        "lingering_time": _LINGER,
        "shutdown_timeout": 5.0,
    }
    if not access_log:
        kwargs["access_log"] = None
    else:
        kwargs["access_log_class"] = AccessLogger  # the dashboard's polls are not API traffic
    return web.AppRunner(app, **kwargs)


async def serve(app: web.Application, host: str, port: int, *, ready: Callable[[str], None]) -> None:
    """Run until SIGINT or SIGTERM; ``ready`` is told the URL once it listens."""
    runner = make_runner(app, access_log=True)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port, backlog=1024)
        try:
            await site.start()
        except OSError as exc:  # in use, not ours to bind, no such address: the operator's to fix
            raise ConfigError(
                f"cannot listen on {host}:{port}: {exc.strerror or exc}; choose another --port or --host"
            ) from None
        address = runner.addresses[0]
        shown = f"[{address[0]}]" if ":" in str(address[0]) else address[0]
        url = f"http://{shown}:{address[1]}"
        replicas = app.get(REPLICAS)
        if replicas is not None and replicas.address is None:
            replicas.set_address(url)  # the CLI requires --advertise-url when this is a wildcard
        ready(url)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        await runner.cleanup()
