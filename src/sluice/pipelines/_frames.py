"""Batches as engines hand them over, to rows and back: a pandas DataFrame, a pyarrow
Table, or a dict of columns (numpy arrays or lists: Ray Data's ``numpy`` format).

Values come out as plain Python (a list column read from Arrow arrives as numpy arrays of
dicts), so a row's messages are what ``json.dumps`` takes. The answer's columns are added
beside the input's, in the batch's own type; a column of the same name is replaced.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["DTYPES", "add_columns", "batch_rows", "empty_columns", "plain"]


def plain(value: Any) -> Any:
    """``value`` with numpy arrays as lists and numpy scalars as Python's, all the way down;
    NaN as None, and a whole float as an int (JSON does not tell 5.0 from 5; ``max_tokens``
    must be an int)."""
    if isinstance(value, float):
        if value != value:
            return None  # NaN: a dataframe's missing value
        if value.is_integer() and abs(value) < 2**53:
            return int(value)  # an int column with a gap became floats (pandas, numpy): 5.0 was 5
    if isinstance(value, (str, bytes, int, float, bool)) or value is None:
        return value
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    tolist = getattr(value, "tolist", None)  # a numpy array or scalar
    if callable(tolist):
        return plain(tolist())
    return value


def _kind(batch: Any) -> str:
    module = type(batch).__module__
    if module.startswith("pandas"):
        return "pandas"
    if module.startswith("pyarrow"):
        return "arrow"
    if isinstance(batch, Mapping):
        return "columns"
    raise TypeError(
        f"a batch of rows must be a pandas DataFrame, a pyarrow Table or a dict of columns, got {type(batch).__name__}"
    )


def batch_rows(batch: Any) -> list[dict[str, Any]]:
    """The batch's rows as dicts of plain values."""
    kind = _kind(batch)
    if kind == "pandas":
        return [{str(k): plain(v) for k, v in row.items()} for row in batch.to_dict("records")]
    if kind == "arrow":
        return [{str(k): plain(v) for k, v in row.items()} for row in batch.to_pylist()]
    names = list(batch)
    columns = [plain(batch[name]) for name in names]
    size = len(columns[0]) if columns else 0
    return [{name: column[i] for name, column in zip(names, columns, strict=True)} for i in range(size)]


def add_columns(batch: Any, columns: Mapping[str, list[Any]]) -> Any:
    """``batch`` with ``columns`` added (one value per row), in the batch's own type."""
    kind = _kind(batch)
    if kind == "pandas":
        out = batch.copy()
        for name, values in columns.items():
            out[name] = _series(name, values, out.index)
        return out
    if kind == "arrow":
        import pyarrow

        out = batch
        for name, values in columns.items():
            if name in out.column_names:
                out = out.drop_columns([name])
            out = out.append_column(name, pyarrow.array(_arrow_values(values)))
        return out
    added = dict(batch)
    for name, values in columns.items():
        added[name] = _array(values)
    return added


#: The pandas types of the answer columns (the rest are objects: text, None, dicts, vectors).
DTYPES = {"ok": "bool", "cached": "bool", "attempts": "int64", "cost_usd": "float64"}


def _series(name: str, values: list[Any], index: Any) -> Any:
    import pandas

    dtype = DTYPES.get(name, "object")
    if dtype == "float64":
        values = [float("nan") if v is None else v for v in values]
    if dtype != "object":
        return pandas.Series(values, index=index, dtype=dtype)
    series = pandas.Series([None] * len(values), index=index, dtype=object)
    for i, value in enumerate(values):
        series.iat[i] = value  # a vector stays one value, not spread over rows
    return series


def empty_columns(batch: Any, names: Any) -> Any:
    """``batch`` (a pandas DataFrame, no rows needed) with empty answer columns: the
    ``meta`` Dask asks for, so that it never calls the function on made-up rows."""
    import pandas

    out = batch.iloc[:0].copy()
    for name in names:
        out[name] = pandas.Series(dtype=DTYPES.get(name, "object"))
    return out


def _arrow_values(values: list[Any]) -> list[Any]:
    return [v.tolist() if hasattr(v, "tolist") and not isinstance(v, (int, float, bool)) else v for v in values]


def _array(values: list[Any]) -> Any:
    """A numpy array of ``values`` (objects where they are not all one plain type)."""
    try:
        import numpy
    except ImportError:  # pragma: no cover
        return values
    if values and all(isinstance(v, bool) for v in values):
        return numpy.array(values, dtype=bool)
    if values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return numpy.array(values, dtype=numpy.int64)
    out = numpy.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        out[i] = value
    return out
