"""sluice inside Dask: every partition's rows answered on one shared limit, budget and
store of answers, whatever the workers (``pip install 'llm-sluice[dask]'``).

::

    import dask.dataframe as dd, sluice.dask

    answered = sluice.dask.complete(
        dd.read_parquet("prompts/"), model="openai/gpt-4o-mini",
        redis="redis://queue:6379/0", job="nightly-reviews", rpm=500, budget_usd=20,
    )
    answered.to_parquet("answers/")

:func:`complete` (and :func:`embed`) is ``map_partitions`` with the answer columns'
``meta``, so Dask never calls the function on made-up rows to guess them. The callable it
maps is pickled to each task; each worker process builds one engine for the job on first
use and keeps it (:func:`sluice.pipelines.shared_worker`), so a thousand partitions share
one connection pool, one limiter and one set of budget holds per process. Arguments are
checked here, in the caller's process: a wrong one raises at once. When a worker dies
mid-partition, Dask reruns the partition elsewhere; its rows answered before come from the
store, only those in flight are sent again.
"""

from __future__ import annotations

try:
    import dask.dataframe as _dd  # noqa: F401  (the adapter is for Dask: say so at once if it is missing)
except ImportError:  # pragma: no cover - depends on the environment
    raise ImportError("sluice.dask needs Dask's dataframes: pip install 'llm-sluice[dask]'") from None

from typing import Any

from .._errors import ConfigError
from ..pipelines import CHAT_COLUMNS, EMBEDDING_COLUMNS, RowJob, answer_batch, empty_columns, row_job, shared_worker

__all__ = ["Completions", "Embeddings", "complete", "embed"]


class Completions:
    """A picklable callable for ``map_partitions``: each row's chat completion (columns
    as :class:`sluice.ray.Completions` adds them; arguments as :class:`sluice.pipelines.RowJob`)."""

    _embeddings = False

    def __init__(self, **kwargs: Any) -> None:
        self.job: RowJob = row_job(f"sluice.dask.{type(self).__name__}", kwargs, embeddings=self._embeddings)

    def __call__(self, partition: Any) -> Any:
        if len(partition) == 0:
            return self.meta(partition)
        return answer_batch(shared_worker(self.job), partition)

    def meta(self, frame: Any) -> Any:
        """An empty frame of ``frame``'s columns and the answer's (Dask's ``meta``)."""
        names: tuple[str, ...] = EMBEDDING_COLUMNS if self.job.embeddings else CHAT_COLUMNS
        if self.job.schema is not None:
            names = (*names, "parsed")
        return empty_columns(frame, names)


class Embeddings(Completions):
    """Each row's vector (its ``text`` column, or ``text_column=``)."""

    _embeddings = True


def _lists_kept(frame: Any) -> None:
    """Dask makes object columns strings (``dataframe.convert-string``): a ``messages`` or
    ``body`` column would reach sluice as the text of a list. Said at once, with the fix."""
    columns = [c for c in ("messages", "body") if c in frame.columns and str(frame.dtypes[c]).startswith("string")]
    if columns:
        raise ConfigError(
            f"sluice.dask: the column {columns[0]!r} holds text, not lists or dicts: Dask made it a string column. "
            'Build the frame under dask.config.set({"dataframe.convert-string": False})'
        )


def complete(frame: Any, **kwargs: Any) -> Any:
    """``frame`` (a Dask DataFrame) with each row's answer columns, lazily."""
    _lists_kept(frame)
    mapped = Completions(**kwargs)
    return frame.map_partitions(mapped, meta=mapped.meta(frame._meta))


def embed(frame: Any, **kwargs: Any) -> Any:
    """``frame`` with each row's vector, lazily."""
    mapped = Embeddings(**kwargs)
    return frame.map_partitions(mapped, meta=mapped.meta(frame._meta))
