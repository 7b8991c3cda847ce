"""sluice inside other engines' pipelines: the seam every adapter (``sluice.ray``,
``sluice.dask``) is glue on.

An adapter hands this package a batch in its engine's format; it comes back with the
answer columns added. Everything else is here and engine-agnostic: the arguments checked
once (:func:`row_job`), rows made requests as lines of a ``sluice run`` file are
(:mod:`._rows`), batch formats to rows and back (:mod:`._frames`), the worker's Engine on
the shared Redis limiter, budget and answers (:mod:`._worker`, :mod:`._store`), and the
job's progress and report from any machine (:mod:`._progress`).

Nothing here imports an engine. ``import sluice`` imports none of it.
"""

from ._frames import add_columns, batch_rows, empty_columns
from ._job import RowJob, row_job
from ._progress import job_progress, progress_rows, read_progress, snapshot_state
from ._rows import CHAT_COLUMNS, EMBEDDING_COLUMNS
from ._worker import RowWorker, shared_worker

__all__ = [
    "CHAT_COLUMNS",
    "EMBEDDING_COLUMNS",
    "RowJob",
    "RowWorker",
    "add_columns",
    "answer_batch",
    "batch_rows",
    "empty_columns",
    "job_progress",
    "progress_rows",
    "read_progress",
    "row_job",
    "shared_worker",
    "snapshot_state",
]


def answer_batch(worker: RowWorker, batch: object) -> object:
    """``batch`` (a DataFrame, Table or dict of columns) with its answer columns added."""
    rows = batch_rows(batch)
    return add_columns(batch, worker.answer(rows))
