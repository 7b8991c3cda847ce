"""The site's generated references, made from the code at every build so they cannot drift.

A page holds a marker (``<!-- sluice:config -->``, ``<!-- sluice:errors -->``) that this
MkDocs hook replaces with tables made from the definitions themselves: the dataclasses
``sluice.toml`` is read into (their fields, defaults and ``#:`` comments), and the error
classes (their ``kind``, parent and docstring). ``tests/test_docs.py`` holds the pages to
the code: a key or an error without a description fails it.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import textwrap
from typing import Any

#: What a key means where its dataclass says nothing of it (no ``#:`` comment); a key
#: that neither describes is a test failure, so a new one cannot go undocumented.
DESCRIBED: dict[str, dict[str, str]] = {
    "top": {
        "model": "The model of records that name none (`--model`).",
        "concurrency": "Requests in flight at once, over every deployment (`--concurrency`).",
        "budget_usd": "The most the job may spend, in USD, across reruns and crashes (`--budget`).",
        "allow_unpriced": "Run models with no known price under a budget (`--allow-unpriced`).",
        "retry": "The `[retry]` table.",
        "deployment": "The `[[deployment]]` tables (also spelt `deployments`).",
        "deployments": "The same as `deployment`.",
        "fallbacks": "`[fallbacks]`: for a model, the models to try next when it cannot take a request.",
        "cooldown": "The `[cooldown]` table.",
        "client": "`sluice serve`'s `[[client]]` tables.",
        "serve": "`sluice serve`'s `[serve]` table.",
    },
    "retry": {
        "max_attempts": "Attempts of one request, the first included.",
        "base_delay": "Seconds of the first backoff (capped exponential, full jitter).",
        "max_delay": "The longest backoff between two attempts, in seconds.",
    },
    "deployment": {
        "model": (
            "`provider/model` (`openai/gpt-4o-mini`, `anthropic/...`, `simulate/demo`); bare: OpenAI-compatible."
        ),
        "rpm": "Requests per `window`.",
        "tpm": "Tokens per `window` (prompt estimate + `max_tokens`, reconciled with the usage reported).",
        "max_in_flight": "Requests awaiting an answer at once (unset: learnt, adaptive).",
        "window": "Seconds the per-window limits count over.",
        "burst_requests": "Requests allowed at once beyond the even pace.",
        "burst_tokens": "Tokens allowed at once beyond the even pace (for `tpm`).",
        "base_url": "Where the requests go (any OpenAI-compatible server).",
        "api_key": "The key itself; prefer `api_key_env` (keys stay in the environment).",
        "api_key_env": "The environment variable holding the key.",
        "name": "This deployment's name in a group of deployments of one model.",
        "default_max_tokens": "The output cap sent with a request that gives none, under a budget.",
        "headers": "HTTP headers sent with every request.",
        "options": (
            "Provider options (`structured`, `responses`, `batch_discount`, `flex_discount`, `embed_token_arrays`...)."
        ),
        "provider": "The provider's name, when the model's prefix does not say it.",
        "otpm": "Output tokens per `window`: a limit of its own beside `tpm` (Anthropic's OTPM).",
        "price": "`{input_per_mtok, output_per_mtok}`: USD per million tokens, for models genai-prices does not know.",
    },
    "cooldown": {
        "after_failures": "Consecutive failures (5xx, 529, connection errors, timeouts, 429s) that take it out.",
        "seconds": "The first cooldown, doubling each time it fails again (its probe included).",
        "max_seconds": "The longest cooldown; a `Retry-After` within it sets a longer one.",
    },
    "serve": {
        "client_parse_budget_mb": "... and per client; past them a body waits (up to `max_wait_s`).",
        "client_files": "How many files one client may keep.",
        "upload_timeout_s": "The longest one upload may take, however steadily it arrives.",
        "max_queue": "Requests waiting for capacity; past it: 429 + Retry-After.",
        "max_wait_s": "The longest wait for capacity (a request may ask less: `x-sluice-max-wait`).",
        "header_timeout_s": "Seconds a client has to send its headers (slow or stalled clients are cut off).",
        "body_timeout_s": "Seconds a client has to send its body once the headers are in.",
        "max_body_mb": "A larger JSON body: 413 (uploads have their own limits).",
    },
    "client": {
        "name": "The client's name (in `/metrics`, the dashboard and its budget's key).",
        "key_env": "The environment variable holding its key (16 characters or more).",
        "budget_usd": "What it may spend, kept in `--state`: a restart resets nothing.",
        "rpm": "Its own requests per minute, in front of the deployments'.",
        "tpm": "Its own tokens per minute, in front of the deployments'.",
        "models": "What it may use and see (default: every model).",
    },
}


def field_comments(cls: type) -> dict[str, str]:
    """A dataclass's ``#:`` comments, by the field they stand above."""
    source = textwrap.dedent(inspect.getsource(cls))
    lines = source.splitlines()
    comments: dict[str, str] = {}
    for node in ast.parse(source).body[0].body:  # type: ignore[attr-defined]
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            above: list[str] = []
            row = node.lineno - 2
            while row >= 0 and lines[row].strip().startswith("#:"):
                above.insert(0, lines[row].strip()[2:].strip())
                row -= 1
            if above:
                comments[node.target.id] = " ".join(above)
    return comments


def tables() -> list[tuple[str, str, type | None, list[str]]]:
    """(title, the DESCRIBED section, dataclass or None, keys) for each table sluice.toml has."""
    from sluice import Deployment, RetryPolicy
    from sluice._config import JobConfig
    from sluice._router import Cooldown
    from sluice.cli import _config as loader
    from sluice.serve.core._settings import ClientSpec, ServeSettings

    def names(cls: type) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    top = sorted(
        loader._TOP_KEYS,
        key=lambda k: (k in ("retry", "deployment", "deployments", "fallbacks", "cooldown", "client", "serve"), k),
    )
    return [
        ("Top level", "top", JobConfig, top),
        ("`[retry]`", "retry", RetryPolicy, names(RetryPolicy)),
        ("`[[deployment]]`", "deployment", Deployment, names(Deployment)),
        ("`[cooldown]`", "cooldown", Cooldown, names(Cooldown)),
        ("`[serve]` (`sluice serve`)", "serve", ServeSettings, names(ServeSettings)),
        ("`[[client]]` (`sluice serve`)", "client", ClientSpec, names(ClientSpec)),
    ]


def describe(section: str, cls: type | None, key: str) -> str:
    """A key's description: its dataclass's ``#:`` comment, else :data:`DESCRIBED`, else ''."""
    comments = field_comments(cls) if cls is not None else {}
    return _markdown(comments.get(key) or DESCRIBED.get(section, {}).get(key, ""))


def _default(cls: type | None, key: str) -> str:
    if cls is None or not dataclasses.is_dataclass(cls):
        return ""
    for f in dataclasses.fields(cls):
        if f.name == key:
            if f.default is not dataclasses.MISSING:
                return "" if f.default is None else f"`{f.default!r}`".replace("'", '"')
            return ""
    return ""


def _markdown(text: str) -> str:
    """reST roles (``:mod:`x` ``, ``:class:`~x` ``) as the code spans Markdown has."""
    return re.sub(r":[a-z]+:`~?([^`]+)`", r"`\1`", text)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def config_reference() -> str:
    out: list[str] = []
    for title, section, cls, keys in tables():
        out += [f"## {title}", ""]
        if cls is not None and cls.__doc__ and section != "top":
            out += [_markdown(" ".join(cls.__doc__.split())), ""]
        out += ["| key | default | what it is |", "| --- | --- | --- |"]
        fields = {f.name for f in dataclasses.fields(cls)} if cls is not None else set()
        for key in keys:
            default = _default(cls, key) if key in fields else ""
            out.append(f"| `{key}` | {_cell(default)} | {_cell(describe(section, cls, key))} |")
        out.append("")
    out += [
        "## `[fallbacks]`",
        "",
        'A table of `"model" = ["next model", ...]`: where a request goes when every deployment of its model '
        "is cooling down or has failed it ([Several deployments](../guides/router.md)).",
        "",
    ]
    return "\n".join(out)


#: Packages that define no error and are slow or optional to import.
_NOT_WALKED = ("sluice.ray", "sluice.dask", "sluice.otel", "sluice.__main__")


def _import_every_module() -> None:
    """Every module of sluice imported, so that the subclasses walked are all of them, not
    those the process happened to import (a test process has more than a build)."""
    import importlib
    import pkgutil

    import sluice

    for info in pkgutil.walk_packages(sluice.__path__, "sluice."):
        if not info.name.startswith(_NOT_WALKED):
            importlib.import_module(info.name)


def error_classes() -> list[type]:
    from sluice import SluiceError

    _import_every_module()
    seen: list[type] = []
    pending: list[type] = [SluiceError]
    while pending:
        cls = pending.pop(0)
        if cls not in seen:
            seen.append(cls)
            pending.extend(sorted(cls.__subclasses__(), key=lambda c: c.__name__))
    return [cls for cls in seen if not cls.__name__.startswith("_")]  # a private one is no user's


def errors_reference() -> str:
    import sluice

    exported = set(sluice.__all__)
    out = [
        "| class | derives from | `error.type` in a record | retried | what it means |",
        "| --- | --- | --- | --- | --- |",
    ]
    retryable = sluice.RetryableError
    for cls in error_classes():
        name = f"`sluice.{cls.__name__}`" if cls.__name__ in exported else f"`{cls.__name__}` (not exported)"
        parent = next((b.__name__ for b in cls.__bases__ if issubclass(b, sluice.SluiceError)), "Exception")
        doc = inspect.getdoc(cls) or ""
        doc = " ".join(doc.split("\n\n")[0].split()) if cls.__doc__ else ""
        kind = getattr(cls, "kind", "")
        retried = "yes" if issubclass(cls, retryable) else ""
        out.append(f"| {name} | `{parent}` | `{kind}` | {retried} | {_cell(_markdown(doc))} |")
    return "\n".join(out) + "\n"


def examples_reference() -> str:
    """Each command's most common use: the line its ``--help`` ends on."""
    from sluice.cli._examples import EXAMPLES

    out = ["| command | its most common use |", "| --- | --- |"]
    for where, line in EXAMPLES.items():
        out.append(f"| `sluice{' ' + where if where else ''}` | `{line}` |")
    return "\n".join(out) + "\n"


MARKERS: dict[str, Any] = {
    "<!-- sluice:examples -->": examples_reference,
    "<!-- sluice:config -->": config_reference,
    "<!-- sluice:errors -->": errors_reference,
}


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    for marker, make in MARKERS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, make())
    return markdown
