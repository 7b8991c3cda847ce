"""``sluice report --html FILE`` and ``--json``: the plotted and the machine-readable report.

The HTML is written whole or not at all (a file beside the target, renamed over it), so
a failed write never leaves half a report, and a target that cannot be written is said
before the report is made (a million-line job's takes a few seconds).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

__all__ = ["check_html_target", "pipeline_report", "plotted_report", "refuse_clobbering"]

#: What every report this writes has in its first bytes (``report.html.j2``), so an
#: existing file that lacks it is not overwritten without ``--force``.
REPORT_START = b"<!DOCTYPE html>"
REPORT_MARKER = b'<meta name="generator" content="sluice '


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
    if target.exists() and not target.is_file():
        return f"--html {target} exists and is not a regular file (a device, a pipe, a socket); give a file to write"
    if target.exists() and not os.access(target, os.W_OK):
        return f"--html {target}: the file exists and cannot be written (permission denied)"
    return None


def refuse_clobbering(target: Path, state: Path, output: Path | None, force: bool) -> str | None:
    """Why the report must not be written over ``target`` (None: it may): the job's own
    files (its state and SQLite's files beside it, its output, its input), never; any
    other existing file that is not an earlier sluice report, only with ``--force``."""
    if str(target) == "-":
        return None
    meta = _meta_of(state)
    own = {
        "the job's state file": state,
        **{f"the state's {suffix} file": Path(f"{state}{suffix}") for suffix in ("-wal", "-shm", "-journal")},
    }
    for key, what in (("output", "the job's output"), ("input", "the job's input")):
        named = meta.get(key)
        if isinstance(named, str) and named:
            own[what] = Path(named)
    if output is not None:
        own["the job's output"] = output
    for what, path in own.items():
        if _same_file(target, path):
            return f"--html {target} is {what} ({path}); give another file for the report"
    if target.exists() and not force and not _looks_like_report(target):
        return f"--html {target} exists and is not a sluice report; give another file, or --force to overwrite it"
    return None


def _same_file(a: Path, b: Path) -> bool:
    with contextlib.suppress(OSError):
        if a.exists() and b.exists():
            return os.path.samefile(a, b)
    try:
        return a.resolve() == b.resolve()
    except (OSError, RuntimeError):
        return False


def _looks_like_report(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            head = f.read(2048)
    except OSError:
        return False
    return head.startswith(REPORT_START) and REPORT_MARKER in head


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
    output = _meta_of(state).get("output")
    return Path(output) if isinstance(output, str) else None


def _meta_of(state: Path) -> dict[str, Any]:
    from ..store import SqliteStore

    store = SqliteStore(state, readonly=True)
    try:
        return store.meta()
    finally:
        store.close()


def write_html(report: dict[str, Any], target: Path) -> int:
    """Render and write the report; its size in bytes. Raises OSError when writing fails."""
    from ..report import render_html

    page = render_html(report).encode("utf-8")
    if str(target) == "-":
        sys.stdout.buffer.write(page)
        sys.stdout.buffer.flush()
        return len(page)
    if target.exists() and not target.is_file():  # renamed over, a device or a pipe would be gone
        raise OSError(errno.EEXIST, "it exists and is not a regular file")
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


def pipeline_report(
    state: Path | None,
    url: str | None,
    job: str | None,
    html: Path | None,
    as_json: bool,
    print_table: Callable[[str, list[tuple[str, str]]], None],
) -> str | None:
    """With ``--redis`` and ``--job``: a pipeline job's report (``sluice.ray``,
    ``sluice.dask``) from its Redis, the table of its progress or the plotted report of a
    copy of its answers; None when done, else why not. ``""``: not a pipeline's, a STATE's."""
    import asyncio

    from .._errors import SluiceError
    from ..pipelines import job_progress, progress_rows, snapshot_state

    if (url is None) != (job is None):
        return "--redis and --job go together: the pipeline job's Redis and its name"
    if url is None or job is None:
        return "" if state is not None else "give the job's STATE file (or its output), or --redis URL --job NAME"
    if state is not None:
        return "give a STATE file, or --redis and --job, not both"
    try:
        progress = asyncio.run(job_progress(url, job))
    except SluiceError as exc:
        return exc.message
    if html is None and not as_json:
        print_table(f"sluice report --job {job}", progress_rows(progress))
        return None
    with tempfile.TemporaryDirectory(prefix="sluice-report-") as tmp:
        copy = Path(tmp) / "job.sluice.db"
        snapshot_state(url, job, copy)
        return plotted_report(copy, None, html, as_json)
