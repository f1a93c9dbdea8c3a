"""D4: the run of a burst records its outcome under every dispatch id it absorbed, so that
``AsyncResult(id).get()`` of a superseded dispatch returns (or raises) what the run did.

On Celery's Redis result backend this is one pipelined write (SET + PUBLISH per id, as the
backend itself does for one id); on other backends one ``store_result`` per id.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from celery import states

from dedup_jobs.jobs.base import logger


def record_outcome(
    backend: Any, task_ids: Sequence[str], result: Any, state: str, traceback: str | None = None
) -> None:
    """Store ``result`` with ``state`` (SUCCESS or FAILURE) under each of ``task_ids``."""
    if not task_ids:
        return
    try:
        encoded = backend.encode_result(result, state)
        if _is_redis(backend):
            _pipelined(backend, task_ids, encoded, state, traceback)
            return
        for task_id in task_ids:
            backend.store_result(task_id, result, state, traceback=traceback)
    except Exception:
        logger.warning(
            "Could not record the outcome (%s) under %d absorbed dispatch ids; their "
            "AsyncResults stay PENDING.",
            state,
            len(task_ids),
            exc_info=True,
        )


def _is_redis(backend: Any) -> bool:
    from celery.backends.redis import RedisBackend

    return isinstance(backend, RedisBackend) and hasattr(backend, "client")


def _pipelined(
    backend: Any, task_ids: Sequence[str], encoded: Any, state: str, traceback: str | None
) -> None:
    meta = backend._get_result_meta(result=encoded, state=state, traceback=traceback, request=None)
    expires = backend.expires
    with backend.client.pipeline(transaction=False) as pipe:
        for task_id in task_ids:
            value = backend.encode({**meta, "task_id": task_id})
            key = backend.get_key_for_task(task_id)
            pipe.set(key, value, ex=expires or None)
            pipe.publish(key, value)
        pipe.execute()


SUCCESS = states.SUCCESS
FAILURE = states.FAILURE
