"""What a batch job checks before it creates a file or sends a request.

A job that cannot work is refused at once (exit 2, with what to change) rather than
after it has made an output and a state file, or spent its first requests finding out:
paths that are not files or whose directory is missing, an input that is not text, a
``--template`` naming a column the CSV header lacks, input in which no record can become
a request (no model anywhere, every line malformed), and a configured deployment (or the
one that would serve the first record's model) whose API key is not set, as the engine
would refuse it on start. One bad line among good ones is still that line's own error
record: these checks refuse only what fails every line.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from .._errors import ConfigError, InvalidInputError, SluiceError
from .._model_names import configured_model
from .._models import Deployment
from ..providers import check_deployment
from ._inputs import InputItem, detect_format, read_inputs

if TYPE_CHECKING:
    from .._config import JobConfig
    from ._inputs import InputOptions
    from ._job import JobSpec

__all__ = ["check_input", "checked_spec", "first_request_model"]

#: How much of the input is read to tell text from binary data.
_SNIFF_BYTES = 64 * 1024


def checked_spec(spec: JobSpec) -> JobSpec:
    """``spec`` with its paths resolved, once everything here has passed; raises a
    :class:`~sluice.SluiceError` saying what to change otherwise. Creates nothing."""
    sends = spec.distributed is None or spec.distributed.local_worker  # this process sends requests
    if sends:
        _refuse_missing_keys(spec.config.deployments)
    model = check_input(spec.input, spec.inputs)
    if sends:
        used = _deployments_used(spec.config, model)
        _refuse_missing_keys(used)
        _refuse_unpriced(spec.config, used)
    for flag, path in (("-o", spec.output), ("--state", spec.state)):
        _check_output_path(flag, path)
    input_, output, state = spec.input.resolve(), spec.output.resolve(), spec.state.resolve()
    if input_ == output:
        raise ConfigError("the output file must not be the input file")
    if state in (input_, output):
        raise ConfigError(f"--state {spec.state} must be a file of its own, not the input or the output")
    return dataclasses.replace(spec, input=input_, output=output)


def check_input(path: Path, options: InputOptions) -> str | None:
    """Refuse an input in which no record can become a request; the first one's model."""
    _check_input_path(path)
    _check_text(path)
    _check_columns(path, options)
    return first_request_model(path, options)


def _check_input_path(path: Path) -> None:
    if path.is_dir():
        raise InvalidInputError(f"{path} is a directory; give the JSONL or CSV file of requests inside it")
    if not path.exists():
        raise InvalidInputError(f"{path}: no such input file")
    if not path.is_file():
        raise InvalidInputError(f"{path} is not a regular file; give a JSONL or CSV file")
    if not os.access(path, os.R_OK):
        raise InvalidInputError(f"{path}: cannot read it (permission denied)")
    if path.stat().st_size == 0:
        raise InvalidInputError(f"{path} is empty: there are no requests to run")


def _check_output_path(flag: str, path: Path) -> None:
    if path.is_dir():
        raise ConfigError(f"{flag} {path} is a directory; give a file path")
    if path.exists() and not stat.S_ISREG(path.stat().st_mode):
        raise ConfigError(f"{flag} {path} is not a regular file; give a file path")
    parent = path.absolute().parent
    if not parent.is_dir():
        raise ConfigError(f"{flag} {path}: the directory {parent} does not exist; create it first (mkdir -p {parent})")
    if not os.access(parent, os.W_OK):
        raise ConfigError(f"{flag} {path}: the directory {parent} is not writable")


def _check_text(path: Path) -> None:
    """Refuse binary data (an image, an archive, random bytes) as a whole, instead of one
    'not valid UTF-8' record per line of it. A stray bad byte in a text file stays that
    line's own error: the file is refused only for a NUL byte, or when most lines of its
    first 64 KiB are not UTF-8."""
    with path.open("rb") as f:
        head = f.read(_SNIFF_BYTES)
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise InvalidInputError(f"{path} is UTF-16 text; save it as UTF-8 (JSONL or CSV) and run it again")
    offset = head.find(b"\x00")
    if offset >= 0:
        _not_text(path, f"a NUL byte at offset {offset:,}")
    lines = head.split(b"\n")
    if len(head) == _SNIFF_BYTES and len(lines) > 1:
        lines.pop()  # cut by the sample's end: not a whole line
    bad: list[tuple[int, int]] = []  # (offset of the byte, the byte)
    start = 0
    for line in lines:
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as exc:
            bad.append((start + exc.start, line[exc.start]))
        start += len(line) + 1
    if len(lines) > 1 and len(bad) * 2 > len(lines):
        where, byte = bad[0]
        _not_text(
            path,
            f"{len(bad):,} of its first {len(lines):,} lines are not UTF-8, from byte 0x{byte:02x} at offset {where:,}",
        )


def _not_text(path: Path, why: str) -> NoReturn:
    raise InvalidInputError(f"{path} is not text ({why}): give a JSONL file of requests, or a CSV file with --template")


def _check_columns(path: Path, options: InputOptions) -> None:
    """A CSV header must name every field the job reads from its rows."""
    if detect_format(path, options.format) != "csv":
        return
    wanted = {f"{{{name}}} in --template": name for name in (options.template.fields if options.template else ())}
    if options.embed_field is not None:
        wanted[f"--embed {options.embed_field}"] = options.embed_field
    if options.id_field is not None:
        wanted[f"--id-field {options.id_field}"] = options.id_field
    if not wanted:
        return  # no --template or --embed: the reader says what is missing
    dialect: type[csv.Dialect] = csv.excel_tab if path.suffix.lower() == ".tsv" else csv.excel
    with path.open(encoding="utf-8-sig", errors="replace", newline="") as f:
        try:
            header = [column.strip() for column in next(csv.reader(f, dialect))]
        except (StopIteration, csv.Error):
            return  # the reader reports a missing or broken header
    missing = [flag for flag, name in wanted.items() if name not in header]
    if missing:
        raise ConfigError(
            f"{path}: the CSV header has no column for {', '.join(missing)} "
            f"(its columns: {', '.join(repr(c) for c in header) or 'none'}); fix the flag or the header"
        )


def first_request_model(path: Path, options: InputOptions) -> str | None:
    """The model of the input's first record that can be sent; raises when no record can.

    Reads only as far as that record (usually the first line). When none can be sent,
    the whole file was read once, and the job refused: the message is the first error,
    or, when every record lacks a model, what to give."""
    first: InputItem | None = None
    lacking_model = 0
    records = 0
    for item in read_inputs(path, options):
        records += 1
        if item.request is not None:
            return item.request.model
        if item.embedding is not None:
            return item.embedding.model
        assert item.error is not None
        first = first or item
        if "no model;" in item.error.message:
            lacking_model += 1
    if records and lacking_model == records:
        raise ConfigError(
            f"no model: none of the {records:,} records of {path} names one; "
            "give --model (e.g. --model openai/gpt-4o-mini), or a 'model' field in each line, "
            'or model = "..." in sluice.toml'
        )
    if first is not None and first.error is not None:
        raise InvalidInputError(
            f"{path}: none of its {records:,} records can be sent; the first: {first.error.message}"
        )
    return None  # a file of blank lines: the job has nothing to do and says so


def _deployments_used(config: JobConfig, first_model: str | None) -> list[Deployment]:
    """The deployments the config names, and the one that serves the first record's model."""
    deployments = list(config.deployments)
    # a bare name is the configured model of that name (two such: refused here, naming them)
    if first_model is not None and configured_model(first_model, deployments) is None:
        known = configured_model(f"openai/{first_model}", deployments) if "/" not in first_model else None
        if known is None:
            with contextlib.suppress(SluiceError):  # a model the engine refuses is that record's error
                deployments.append(Deployment(first_model, **config.defaults))
    return deployments


def _refuse_unpriced(config: JobConfig, deployments: Iterable[Deployment]) -> None:
    """Under a budget, a deployment with no known price is refused (unless allowed), as
    the engine would refuse it on start: here, before a file exists."""
    if config.budget_usd is None or config.allow_unpriced:
        return
    from .._spending import Spending  # its price lookup is the one the engine's start makes anyway

    spending = Spending(config.budget_usd)
    for deployment in deployments:
        spending.check_priced(deployment)


def _refuse_missing_keys(deployments: Iterable[Deployment]) -> None:
    """A deployment among ``deployments`` whose API key is not there: refused, saying what to set."""
    problems: dict[str, list[str]] = {}  # what is wrong -> the deployments it is wrong for
    for deployment in deployments:
        try:
            check_deployment(deployment)
        except ConfigError as exc:
            prefix = f"deployment {deployment.label!r}: "
            what = exc.message.removeprefix(prefix)
            labels = problems.setdefault(what, [])
            if deployment.label not in labels:
                labels.append(deployment.label)
    if problems:
        raise ConfigError(
            "; ".join(
                f"deployment{'s' if len(labels) > 1 else ''} {', '.join(map(repr, labels))}: {what}"
                for what, labels in problems.items()
            )
        )
