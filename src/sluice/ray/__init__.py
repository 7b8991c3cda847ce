"""sluice inside Ray Data: every actor of a ``map_batches`` pool answers its rows on one
shared limit, one budget and one store of answers (``pip install 'llm-sluice[ray]'``).

::

    import ray, sluice.ray

    answered = ds.map_batches(
        sluice.ray.Completions,
        fn_constructor_kwargs={"model": "openai/gpt-4o-mini", "redis": "redis://queue:6379/0",
                               "job": "nightly-reviews", "rpm": 500, "budget_usd": 20},
        concurrency=4,         # actors; each answers its batch's rows at once
        num_cpus=0.25,         # they wait on the network, not a CPU
        batch_size=256,
    )

Ray builds the class once per actor; its engine (:class:`sluice.pipelines.RowWorker`)
lives as long as the actor. Batches come in any of Ray's formats (``numpy``, ``pandas``,
``pyarrow``) and go back in the same one, with the answer columns added. A wrong argument
is a :class:`~sluice.ConfigError` naming it, raised when the pool starts; a bad row only
fails its own row. When Ray restarts an actor that died mid-batch and retries the batch,
its rows answered before the death come from the store; only those it had in flight are
sent again.
"""

from __future__ import annotations

try:
    import ray as _ray  # noqa: F401  (the adapter is for Ray: say so at once if it is missing)
except ImportError:  # pragma: no cover - depends on the environment
    raise ImportError("sluice.ray needs Ray Data: pip install 'llm-sluice[ray]'") from None

from typing import Any

from ..pipelines import RowWorker, answer_batch, row_job

__all__ = ["Completions", "Embeddings"]


class Completions:
    """A callable class for ``Dataset.map_batches``: each row's chat completion.

    Rows carry ``messages``, ``body`` or ``prompt`` (and may carry ``custom_id``); the
    batch comes back with ``ok``, ``text``, ``error_type``, ``error``, ``cost_usd``,
    ``attempts``, ``deployment``, ``cached`` (and ``parsed``, with ``schema=``).
    Arguments: see :class:`sluice.pipelines.RowJob` (``model``, ``redis``, ``job``,
    ``rpm``, ``tpm``, ``itpm``, ``otpm``, ``budget_usd``, ``config``, ``schema``,
    ``max_tokens``, ...).
    """

    _embeddings = False

    def __init__(self, **kwargs: Any) -> None:
        job = row_job(f"sluice.ray.{type(self).__name__}", kwargs, embeddings=self._embeddings)
        self._worker = RowWorker(job)

    def __call__(self, batch: Any) -> Any:
        return answer_batch(self._worker, batch)

    def __del__(self) -> None:
        worker = getattr(self, "_worker", None)
        if worker is not None:
            worker.close()


class Embeddings(Completions):
    """Each row's vector (its ``text`` column, or ``text_column=``): the batch comes back
    with ``vector`` (float32), ``ok``, ``error_type``, ``error``, ``cost_usd``,
    ``attempts``, ``deployment``, ``cached``."""

    _embeddings = True
