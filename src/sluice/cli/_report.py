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

__all__ = ["check_html_target", "write_html", "write_json"]


def check_html_target(target: Path) -> str | None:
    """Why ``target`` cannot take the report (None: it can; ``-`` is standard output)."""
    if str(target) == "-":
        return None
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


def write_json(report: dict[str, Any]) -> None:
    click.echo(json.dumps(report, indent=1, allow_nan=False))
