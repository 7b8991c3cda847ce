"""The site (docs/, mkdocs.yml) builds with ``--strict``, opens in headless Chromium with no
console error and nothing fetched off loopback, its search finds things, and its generated
references say what the code does: every command and flag, every ``sluice.toml`` key with a
description, every error type. The guides' commands are commands this CLI takes.

The site is built once per module (~5 s); the tests share an xdist group so it is built once.
"""

from __future__ import annotations

import array
import dataclasses
import functools
import html
import http.server
import importlib.util
import re
import shlex
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import click
import pydantic
import pytest
from browser import needs_chromium, open_page

from sluice.cli import main

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.xdist_group("docs_site")


def _hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_reference_hooks", ROOT / "docs" / "hooks" / "reference.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip(
        "mkdocs", reason="the docs extra is not installed (the test extra takes it: pip install -e '.[test]')"
    )
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": str(Path(sys.executable).parent), "HOME": str(out)},
    )
    assert done.returncode == 0, done.stderr
    assert "WARNING" not in done.stderr
    return out


@pytest.fixture(scope="module")
def served(site: Path) -> Iterator[str]:
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def _text(page: Path) -> str:
    """A built page's text, tags out and entities decoded (for finding names in it)."""
    return html.unescape(re.sub(r"<[^>]+>", " ", page.read_text(encoding="utf-8")))


PAGES = ["", "getting-started/", "guides/batch-job/", "reference/cli/", "reference/config/", "reference/api/"]


@needs_chromium
@pytest.mark.parametrize("path", PAGES)
async def test_a_page_opens_with_no_errors_and_fetches_only_itself(served: str, path: str) -> None:
    async with open_page(served + path, wait_for="article") as seen:
        assert seen.console_errors == []
        assert seen.page_errors == []
        assert seen.refused == []
        assert seen.foreign_requests == []
        assert len(seen.requests) > 3  # its stylesheets and scripts, from the server itself
        assert (await seen.text("h1")).strip()


@needs_chromium
async def test_the_search_finds_a_word(served: str) -> None:
    async with open_page(served, wait_for="article") as seen:
        box = seen.page.locator("input.md-search__input")
        await box.click()
        await box.press_sequentially("idempotency", delay=20)
        await seen.page.wait_for_selector(".md-search-result__item", timeout=30_000)
        results = await seen.page.locator(".md-search-result__item").count()
        assert results >= 1
        assert "Answers that parse" in await seen.text(".md-search-result")
        assert seen.console_errors == []
        assert seen.foreign_requests == []


def _commands(command: click.Command, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    yield path, command
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            yield from _commands(sub, (*path, name))


def test_every_command_and_flag_has_help_and_is_in_the_cli_reference(site: Path) -> None:
    text = _text(site / "reference" / "cli" / "index.html")
    undocumented, missing = [], []
    for path, command in _commands(main):
        name = " ".join(("sluice", *path))
        if name not in text:
            missing.append(name)
        if not (command.help or "").strip():
            undocumented.append(name)
        for param in command.params:
            if isinstance(param, click.Option) and not param.hidden:
                if not (param.help or "").strip():
                    undocumented.append(f"{name} {param.opts[0]}")
                missing += [f"{name} {opt}" for opt in param.opts if opt not in text]
    assert undocumented == []
    assert missing == []


def test_every_command_help_ends_on_an_example(site: Path) -> None:
    text = _text(site / "reference" / "cli" / "index.html")
    for path, command in _commands(main):
        assert command.epilog, " ".join(path) or "sluice"
        example = command.epilog.split("Example:")[1].strip()
        assert example.startswith("sluice ")
        assert example in text
        out = subprocess.run([sys.executable, "-m", "sluice", *path, "--help"], capture_output=True, text=True)
        assert example in " ".join(out.stdout.split())


def test_the_config_reference_is_every_key_the_loader_takes(site: Path) -> None:
    from sluice.cli._config import config_from_bytes
    from sluice.serve.core._settings import serve_tables

    hooks = _hooks()
    text = _text(site / "reference" / "config" / "index.html")
    undescribed = []
    for title, section, cls, keys in hooks.tables():
        for key in keys:
            assert key in text, (title, key)
            if not hooks.describe(section, cls, key):
                undescribed.append(f"{section}.{key}")
    assert undescribed == []
    documented = {section: set(keys) for _, section, _, keys in hooks.tables()}
    # the loader takes each documented key of each table, and refuses one nobody documented
    for section, example in (
        ("retry", "[retry]\n{key} = {value}\n"),
        ("cooldown", "[cooldown]\n{key} = {value}\n"),
        ("serve", "[serve]\n{key} = {value}\n"),
    ):
        cls = next(c for _, s, c, _ in hooks.tables() if s == section)
        for field in dataclasses.fields(cls):
            if field.default is None or field.default is dataclasses.MISSING:
                continue
            value = str(field.default).lower() if isinstance(field.default, bool) else repr(field.default)
            value = value.replace("'", '"')
            raw = example.format(key=field.name, value=value).encode()
            if section == "serve":
                serve_tables(tomllib.loads(raw.decode()), "x.toml")
            config_from_bytes(raw, Path("x.toml"))
            assert field.name in documented[section]
    with pytest.raises(Exception, match="unknown key"):
        config_from_bytes(b"[retry]\nmax_tries = 3\n", Path("x.toml"))
    deployment = '[[deployment]]\nmodel = "simulate/demo"\n'
    for key in documented["deployment"] - {"model", "provider", "price", "headers", "options", "api_key", "tier"}:
        value = {"base_url": '"http://127.0.0.1:1/v1"', "api_key_env": '"X_KEY"', "name": '"x"'}.get(key, "1")
        config_from_bytes(f"{deployment}{key} = {value}\n".encode(), Path("x.toml"))
    with pytest.raises(Exception, match="unknown key"):
        config_from_bytes(f"{deployment}requests_per_minute = 1\n".encode(), Path("x.toml"))


def test_every_error_type_is_in_the_errors_reference(site: Path) -> None:
    import sluice

    hooks = _hooks()
    text = _text(site / "reference" / "errors" / "index.html")
    for cls in hooks.error_classes():
        assert cls.__name__ in text
        assert cls.kind in text
    exported = [n for n in sluice.__all__ if n.endswith("Error")]
    assert all(n in text for n in exported)
    # each says what it means and what to do, in its own words (not its parent's)
    undescribed = [c.__name__ for c in hooks.error_classes() if not c.__doc__ or c.__doc__ == c.__base__.__doc__]
    assert undescribed == []


def test_every_public_name_is_in_the_api_reference(site: Path) -> None:
    import sluice

    built = (site / "reference" / "api" / "index.html").read_text(encoding="utf-8")
    ids = set(re.findall(r'id="(sluice[^"]*)"', built))
    assert sorted(n for n in sluice.__all__ if f"sluice.{n}" not in ids and n != "__version__") == []


def _guide_commands() -> list[tuple[str, str]]:
    found = []
    for page in sorted((ROOT / "docs").rglob("*.md")):
        for block in re.findall(r"```bash\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.DOTALL):
            for line in block.replace("\\\n", " ").splitlines():
                line = line.split(" # ")[0].split("   #")[0].split(" | ")[0].strip().removesuffix("&").strip()
                words = shlex.split(line, comments=True) if line else []
                while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):  # VAR=value before the command
                    words.pop(0)
                if words[:1] == ["sluice"] and "_SLUICE_COMPLETE" not in line:  # completion: not a command
                    found.append((page.relative_to(ROOT).as_posix(), shlex.join(words)))
    return found


def test_the_guides_commands_are_commands_this_cli_takes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each ``sluice ...`` line of a page's bash blocks is parsed by the CLI itself (its
    command, flags and their values: an unknown flag or a bad value fails), in a
    directory holding the files it names."""
    commands = _guide_commands()
    assert len(commands) >= 25
    monkeypatch.chdir(tmp_path)
    for _, line in commands:
        for word in shlex.split(line):
            if re.fullmatch(r"[\w./-]+\.(jsonl|csv|json|toml|db)", word) and not Path(word).exists():
                Path(word).parent.mkdir(parents=True, exist_ok=True)
                Path(word).write_text("")
    bad = []
    for page, line in commands:
        args = [a for a in shlex.split(line)[1:] if a not in ("[", "]")]
        args = [re.sub(r"^\[(.*)\]$", r"\1", a) for a in args]  # [--port 8000] in a synopsis
        args = [a.strip("[]") for a in args]
        try:
            ctx = main.make_context("sluice", list(args))
            while isinstance(ctx.command, click.Group) and [*ctx._protected_args, *ctx.args]:
                name, sub, rest = ctx.command.resolve_command(ctx, [*ctx._protected_args, *ctx.args])
                assert sub is not None
                ctx = sub.make_context(name, rest, parent=ctx)
        except (click.UsageError, click.BadParameter) as e:
            bad.append(f"{page}: {line}: {e}")
    assert bad == []


def _fields(page: str) -> set[str]:
    """The fields a reference page names: every `word` in backticks."""
    return set(re.findall(r"`([a-z_0-9]+)`", (ROOT / "docs" / "reference" / page).read_text(encoding="utf-8")))


def test_every_field_a_record_can_hold_is_on_the_records_page() -> None:
    """Records of every kind (a structured answer from a provider batch with a budget's cap,
    a provider error, an answer that did not parse, a bad line, an embedding) hold no
    field the page leaves out, nor in their usage or error."""
    from sluice import Request, Result, Usage
    from sluice._errors import InvalidOutputError, RateLimitError
    from sluice._records import error_record, usage_record
    from sluice.batch._embed_inputs import EmbeddingInput
    from sluice.batch._embed_job import EmbedLine
    from sluice.batch._inputs import InputItem
    from sluice.batch._output import output_record

    class Answer(pydantic.BaseModel):
        n: int

    documented = _fields("records.md")
    sent = Request.from_prompt("openai/gpt-4o-mini", "hi", schema=Answer)
    capped = dataclasses.replace(sent, max_tokens=256)
    answered = Result(capped, text='{"n": 1}', raw={}, parsed=Answer(n=1), batch_id="b1", tier="batch")
    item = InputItem(line=3, request=sent, custom_id="c-1")
    records = [output_record(item, answered, sent), output_record(InputItem(line=4, error=None), Result(None))]
    embedded = EmbedLine(InputItem(line=5, embedding=EmbeddingInput("openai/e", ("a",), id="e-1")), 1)
    embedded.vectors = [array.array("f", [0.5])]
    records.append(embedded.record())
    errors = [
        error_record(RateLimitError("slow down", status=429, request_id="req_1", provider_type="rate_limit_error")),
        error_record(InvalidOutputError("no", errors=["n: missing"], generation="{}")),
    ]
    usage = usage_record(Usage(10, 2, cached_input_tokens=1, cache_write_tokens=3, cache_write_1h_tokens=3))
    named = {key for record in records for key in record} | {k for e in errors for k in e} | set(usage)
    assert sorted(named - documented) == []


def test_every_exit_status_the_cli_can_give_is_on_the_exit_codes_page() -> None:
    from sluice.cli import EXIT_BROKEN_PIPE, EXIT_INTERNAL
    from sluice.cli._run import EXIT_CODES

    page = (ROOT / "docs" / "reference" / "exit-codes.md").read_text(encoding="utf-8")
    given = {*EXIT_CODES.values(), EXIT_INTERNAL, EXIT_BROKEN_PIPE, 2}  # 2: fail() and click's usage errors
    assert sorted(code for code in given if f"`{code}`" not in page) == []
