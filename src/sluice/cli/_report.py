"""``sluice report --html FILE`` and ``--json``: the plotted and the machine-readable report.

The HTML is written whole or not at all (a file beside the target, renamed over it), so
a failed write never leaves half a report, and a target that cannot be written is said
before the report is made (a million-line job's takes a few seconds).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import click

__all__ = ["check_html_target", "plotted_report"]


def check_html_target(target: Path, as_json: bool) -> str | None:
    """Why ``target`` cannot take the report (None: it can; ``-`` is standard output)."""
    if str(target) == "-":
        return "--html - and --json both write to standard output; give --html a file" if as_json else None
    if target.is_dir():
        return f"--html {target} is a directory; give the file to write, e.g. {target / 'report.html'}"
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        return f"--html {target}: the directory {parent} does not exist"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"--html {target}: cannot write in {parent} (permission denied)"
    if target.exists() and not os.access(target, os.W_OK):
        return f"--html {target}: the file exists and cannot be written (permission denied)"
    return None


def plotted_report(state: Path, output: Path | None, html: Path | None, as_json: bool) -> str | None:
    """Write the report of the job whose state is ``state`` (``output``: its output, when
    given; else the one its state names) to ``html`` and/or print it as JSON; why it could
    not be written, if it could not."""
    from ..report import build_report

    report = build_report(state, output or _output_of(state))
    if html is not None:
        try:
            size = write_html(report, html)
        except OSError as exc:
            return f"cannot write the report to {html}: {exc.strerror or exc}"
        if str(html) != "-":
            click.echo(f"sluice: wrote {html} ({size / 1024:,.0f} KB; self-contained, open it in a browser)", err=True)
    if as_json:
        click.echo(json.dumps(report, indent=1, allow_nan=False))
    return None


def _output_of(state: Path) -> Path | None:
    """The output file the state's notes name (for the lines the report names)."""
    from ..store import SqliteStore

    store = SqliteStore(state, readonly=True)
    try:
        output = store.meta().get("output")
    finally:
        store.close()
    return Path(output) if isinstance(output, str) else None


def write_html(report: dict[str, Any], target: Path) -> int:
    """Render and write the report; its size in bytes. Raises OSError when writing fails."""
    from ..report import render_html

    page = render_html(report).encode("utf-8")
    if str(target) == "-":
        sys.stdout.buffer.write(page)
        sys.stdout.buffer.flush()
        return len(page)
    handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(handle, "wb") as f:
            f.write(page)
        os.chmod(temporary, 0o644)
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    return len(page)
