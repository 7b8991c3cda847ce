"""``sluice export OUTPUT --csv FILE``: a job's records as a table, ``parsed`` flattened into
columns, since that is what people load into a dataframe next.

The output is read twice, streamed (once for the columns and where each line's record
starts, once to write the rows in line order), so a million-line output never sits in
memory; the CSV is written beside FILE and moved into place, so a failed export leaves no
half-written FILE.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from .. import _json
from .._errors import ConfigError

__all__ = ["export_csv"]

#: The record's own columns, first, in this order (``parsed.*`` follow, then ``metadata.*``);
#: ``text`` is the raw answer (for an ``invalid_output`` line, the last one).
_LEADING = ("line", "id", "custom_id", "ok", "error_type", "error", "reasks", "cost_usd", "model", "tier", "text")


def export_csv(output: Path, target: Path) -> int:
    """Write ``output``'s records to ``target`` as CSV; the number of rows written.

    Raises ConfigError, saying what is wrong, for an output that is not a sluice output
    or a target that cannot be written."""
    if target.exists() and target.is_dir():
        raise ConfigError(f"--csv {target}: is a directory; name the file to write")
    with contextlib.suppress(OSError):
        if target.resolve() == output.resolve() or target.resolve() == output.with_suffix(".sluice.db").resolve():
            raise ConfigError(f"--csv {target}: that is the job's own output or state; name another file")
    starts, parsed_columns, metadata_columns, structured = _scan(output)
    columns = [c for c in _LEADING if c != "reasks" or structured]
    columns += [f"parsed.{c}" if c else "parsed" for c in parsed_columns]
    columns += [f"metadata.{c}" for c in metadata_columns]
    directory = target.resolve().parent
    try:
        handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise ConfigError(f"--csv {target}: cannot write in {directory}: {exc.strerror}") from None
    try:
        with os.fdopen(handle, "w", newline="", encoding="utf-8") as f, output.open("rb") as records:
            writer = csv.writer(f)
            writer.writerow(columns)
            for line in sorted(starts):
                records.seek(starts[line])
                writer.writerow(_row(_json.loads(records.readline()), columns))
        os.replace(temporary, target)
    except OSError as exc:
        Path(temporary).unlink(missing_ok=True)
        raise ConfigError(f"--csv {target}: cannot be written: {exc.strerror or exc}") from None
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return len(starts)


def _scan(output: Path) -> tuple[dict[int, int], list[str], list[str], bool]:
    """(where each line's last record starts, the parsed columns, the metadata columns,
    whether any record had a schema)."""
    starts: dict[int, int] = {}
    parsed: dict[str, None] = {}  # ordered sets: columns in the order first seen
    metadata: dict[str, None] = {}
    structured = False
    try:
        f = output.open("rb")
    except OSError as exc:
        raise ConfigError(f"{output}: cannot be read: {exc.strerror}") from None
    with f:
        offset = 0
        for number, raw in enumerate(f, 1):
            at, offset = offset, offset + len(raw)
            if not raw.strip():
                continue
            try:
                record = _json.loads(raw)
            except ValueError:
                if not raw.endswith(b"\n"):
                    break  # a half-written last line (the job is running, or was killed): the next run cuts it
                raise ConfigError(f"{output}:{number}: not a JSON record; is this a sluice output?") from None
            line = record.get("line") if isinstance(record, dict) else None
            if not isinstance(line, int) or isinstance(line, bool) or line < 1:
                raise ConfigError(f"{output}:{number}: not a sluice output record (no 'line')")
            starts[record["line"]] = at
            if "reasks" in record:
                structured = True
                for column, _ in _flat(record.get("parsed")):
                    parsed.setdefault(column)
            meta = record.get("metadata")
            if isinstance(meta, Mapping):
                for key in meta:
                    metadata.setdefault(str(key))
    if not starts:
        raise ConfigError(f"{output}: holds no records")
    return starts, list(parsed), list(metadata), structured


def _flat(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """A parsed answer as (dotted column, value) pairs: objects are opened up, lists and
    scalars are cells (a list as its JSON)."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            yield from _flat(item, f"{prefix}.{key}" if prefix else str(key))
    elif value is not None or prefix:
        yield prefix, value


def _row(record: Mapping[str, Any], columns: list[str]) -> list[Any]:
    error = record.get("error") if isinstance(record.get("error"), Mapping) else None
    cells: dict[str, Any] = {
        "error_type": error.get("type") if error else None,
        "error": error.get("message") if error else None,
    }
    cells.update({f"parsed.{k}" if k else "parsed": v for k, v in _flat(record.get("parsed"))})
    meta = record.get("metadata")
    if isinstance(meta, Mapping):
        cells.update({f"metadata.{k}": v for k, v in meta.items()})
    return [_cell(cells[c] if c in cells else record.get(c)) for c in columns]


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, dict)):
        return json.dumps(value, ensure_ascii=False)
    return value
