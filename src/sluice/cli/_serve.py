"""``sluice serve``: the OpenAI-compatible server over the configured deployments.

Without ``[[client]]`` entries nobody is asked for a key, so the server listens on loopback
only: ``--host 0.0.0.0`` without client keys is refused (exit 2) rather than opening the
deployments' keys and budget to the network.
"""

from __future__ import annotations

import ipaddress
import logging
import tomllib
from pathlib import Path

import click

from .._errors import ConfigError
from ._loop import run_on_loop
from ._otel import otel_option, with_otel
from ._worker import checked_redis_url

__all__ = ["serve_command"]


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


#: Hosts that listen on every interface: no address another replica could use.
_WILDCARDS = frozenset({"", "0.0.0.0", "::", "*"})


def _check_advertise(host: str, redis_url: str | None, advertise_url: str | None) -> None:
    if advertise_url is None:
        if redis_url is not None and host in _WILDCARDS:
            raise ConfigError(
                f"--host {host or repr(host)} with --redis needs --advertise-url: the other replicas forward "
                "requests for this replica's files and batches to it, and cannot reach a wildcard address; "
                "give the address they reach it at, e.g. --advertise-url http://10.0.0.5:8000"
            )
        return
    if redis_url is None:
        raise ConfigError("--advertise-url is for replicas that share a Redis: it needs --redis URL")
    if not advertise_url.startswith(("http://", "https://")):
        raise ConfigError(f"--advertise-url must be an http:// or https:// URL, got {advertise_url[:100]!r}")


def _read(path: Path | None) -> tuple[bytes, Path]:
    """The config's bytes: ``path``, or ``./sluice.toml`` once trusted (as every command)."""
    from ._config import DEFAULT_FILE, read_config_file, untrusted_message
    from ._trust import check_trust

    if path is not None:
        return read_config_file(path), path
    candidate = Path(DEFAULT_FILE)
    if not candidate.is_file():
        raise ConfigError(f"no --config given and no ./{DEFAULT_FILE} here; sluice serve needs its deployments")
    raw = read_config_file(candidate)
    check = check_trust(candidate, raw)
    if check.state != "trusted":
        raise ConfigError(untrusted_message(check.path, check.state))
    return raw, candidate


@click.command("serve")
@click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path),
    help="TOML config: deployments, [serve], [[client]] (default: ./sluice.toml, once trusted).",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True, help="Port (0: any free one).")
@click.option(
    "--state",
    "state_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path(".sluice-serve"),
    show_default=True,
    help="Directory for the server's state: client spend, the engine's store, files and batches.",
)
@click.option(
    "--redis",
    "redis_url",
    metavar="URL",
    callback=checked_redis_url,
    help="Share the deployments' limits, the budgets and each client's spend and rpm/tpm with every "
    "replica that names the same Redis (redis://host:6379/0). A batch is kept and run by the replica that "
    "took it (its --state); any replica answers for it, forwarding the request to that one.",
)
@click.option(
    "--advertise-url",
    metavar="URL",
    help="With --redis: where the other replicas reach this one (http://10.0.0.5:8000). "
    "Default: the address it listens on; required with a wildcard --host such as 0.0.0.0.",
)
@click.option(
    "--redis-fail-open",
    is_flag=True,
    help="While Redis is down, let each replica's own limiters grant (limits become per replica). "
    "Default: refuse with 503 until Redis is back.",
)
@otel_option
def serve_command(
    config_path: Path | None,
    host: str,
    port: int,
    state_dir: Path,
    redis_url: str | None,
    advertise_url: str | None,
    redis_fail_open: bool,
    otel: bool,
) -> None:
    """Serve the OpenAI API (chat, embeddings, models, files, batches) through sluice's engine.

    Several replicas behind one load balancer share limits, budgets and client spend with
    --redis; each keeps its own --state, and any replica answers for any file or batch (it
    forwards the request to the replica that holds it, found through Redis)."""
    from ._config import config_from_bytes, missing_keys

    raw, path = _read(config_path)
    config = with_otel(config_from_bytes(raw, path), otel)
    if not config.deployments:
        raise ConfigError(f"{path} has no [[deployment]]: sluice serve would have no model to answer with")
    from ..serve.core._settings import serve_tables

    settings, clients = serve_tables(tomllib.loads(raw.decode("utf-8")), str(path))
    if not clients and not _loopback(host):
        raise ConfigError(
            f"refusing to listen on {host} without client keys: anyone who can reach it could spend your "
            "deployments' budget. Add [[client]] entries (name, key_env) to the config, or use --host 127.0.0.1"
        )
    problems = missing_keys(config)
    if problems:
        raise ConfigError("; ".join(problems))
    if redis_fail_open and redis_url is None:
        raise ConfigError("--redis-fail-open needs --redis URL")
    _check_advertise(host, redis_url, advertise_url)
    try:
        from ..serve._app import build_app, serve
    except ImportError as exc:  # prometheus-client is the [serve] extra
        raise ConfigError(f"sluice serve needs the serve extra: pip install 'llm-sluice[serve]' ({exc})") from None

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("aiohttp.access").setLevel(logging.INFO)

    async def main() -> None:
        app = build_app(
            config,
            settings,
            clients,
            state_dir,
            redis_url=redis_url,
            redis_fail_open=redis_fail_open,
            advertise_url=advertise_url,
        )
        who = ", ".join(c.name for c in clients) if clients else "anyone on this machine (no [[client]] keys)"
        await serve(
            app,
            host,
            port,
            ready=lambda url: click.echo(
                f"sluice serve: listening on {url} (base_url {url}/v1); clients: {who}"
                + (f"; dashboard {url}/dashboard" if settings.admin_key_env or not clients else "")
            ),
        )

    run_on_loop(main())
