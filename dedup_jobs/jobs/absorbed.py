"""D4: the run of a burst records its outcome under every dispatch id it absorbed, so that
``AsyncResult(id).get()`` of a superseded dispatch returns (or raises) what the run did.

On Celery's Redis result backend this is one pipelined write (SET + PUBLISH per id, as the
backend itself does for one id); on other backends one ``store_result`` per id.

D8: a chain link dispatch *remembers* its chain's later links under its own id before it
reaches the store (:func:`remember_chain`: a PENDING result whose value is
``{CHAIN_MARKER: links}``), because the store keeps only the latest dispatch's payload and a
superseded one's links would be lost. Recording the outcome over those ids hands the
remembered links back (on Redis the same SETs return the values they replace, so a burst
without chains pays nothing for it; elsewhere one read per id precedes its write).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from celery import states

from dedup_jobs.jobs.base import logger

#: the key of a remembered chain in a PENDING result's value
CHAIN_MARKER = "dedup_jobs.chain"

#: task id → the later links of its chain (Celery's ``request.chain`` order)
Remembered = dict[str, list[dict[str, Any]]]


def record_outcome(
    backend: Any, task_ids: Sequence[str], result: Any, state: str, traceback: str | None = None
) -> Remembered:
    """Store ``result`` with ``state`` (SUCCESS, FAILURE or REVOKED) under each of
    ``task_ids``; return the chains remembered under any of them (D8)."""
    if not task_ids:
        return {}
    try:
        encoded = backend.encode_result(result, state)
        if is_redis(backend):
            return _pipelined(backend, task_ids, encoded, state, traceback)
        found: Remembered = {}
        readable = keeps_results_by_id(backend)
        for task_id in task_ids:
            links = _remembered_at(backend, task_id) if readable else None
            if links:
                found[task_id] = links
            backend.store_result(task_id, result, state, traceback=traceback)
        return found
    except Exception:
        logger.warning(
            "Could not record the outcome (%s) under %d absorbed dispatch ids; their "
            "AsyncResults stay PENDING.",
            state,
            len(task_ids),
            exc_info=True,
        )
        return {}


def remember_chain(backend: Any, task_id: str, links: list[dict[str, Any]]) -> None:
    """Keep the later ``links`` of a chain dispatch under its own (not yet used) id, as a
    PENDING result, for the run that absorbs it. Never over an existing result."""
    if not keeps_results_by_id(backend):
        return
    value = {CHAIN_MARKER: links}
    try:
        if is_redis(backend):
            meta = backend._get_result_meta(
                result=backend.encode_result(value, states.PENDING),
                state=states.PENDING,
                traceback=None,
                request=None,
            )
            meta["task_id"] = task_id
            backend.client.set(
                backend.get_key_for_task(task_id),
                backend.encode(meta),
                ex=backend.expires or None,
                nx=True,
            )
        elif backend.get_state(task_id) == states.PENDING:
            backend.store_result(task_id, value, states.PENDING)
    except Exception:
        logger.warning(
            "Could not remember the chain of dispatch %s; if it is superseded, its later "
            "links never run but their results stay PENDING.",
            task_id,
            exc_info=True,
        )


def remembered(meta: Any) -> list[dict[str, Any]] | None:
    """The links remembered in a result's meta, if it is such a PENDING result."""
    if not isinstance(meta, dict) or meta.get("status") != states.PENDING:
        return None
    value = meta.get("result")
    links = value.get(CHAIN_MARKER) if isinstance(value, dict) else None
    return list(links) if isinstance(links, list) and links else None


def _remembered_at(backend: Any, task_id: str) -> list[dict[str, Any]] | None:
    try:
        return remembered(backend.get_task_meta(task_id))
    except Exception:
        logger.warning("Could not read the result of %s", task_id, exc_info=True)
        return None


def keeps_results_by_id(backend: Any) -> bool:
    """False when no result backend is configured, and for ``rpc://`` (results travel to the
    caller's reply queue): there is nothing to remember a chain in, nor to read back."""
    from celery.backends.base import DisabledBackend
    from celery.backends.rpc import RPCBackend

    return not isinstance(backend, (DisabledBackend, RPCBackend))


def is_redis(backend: Any) -> bool:
    from celery.backends.redis import RedisBackend

    return isinstance(backend, RedisBackend) and hasattr(backend, "client")


def _pipelined(
    backend: Any, task_ids: Sequence[str], encoded: Any, state: str, traceback: str | None
) -> Remembered:
    from redis.exceptions import ResponseError

    meta = backend._get_result_meta(result=encoded, state=state, traceback=traceback, request=None)
    expires = backend.expires or None
    values = [
        (backend.get_key_for_task(task_id), backend.encode({**meta, "task_id": task_id}))
        for task_id in task_ids
    ]
    try:
        # SET ... GET (Redis 6.2+) hands back what each write replaces: remembered chains.
        replies = _write(backend, values, expires, get=True)
    except ResponseError:
        _write(backend, values, expires, get=False)  # an older server: chains not found
        return {}
    found: Remembered = {}
    for task_id, previous in zip(task_ids, replies[0::2], strict=True):
        if previous:
            links = remembered(backend.decode(previous))
            if links:
                found[task_id] = links
    return found


def _write(backend: Any, values: list[tuple[str, Any]], expires: Any, *, get: bool) -> list[Any]:
    with backend.client.pipeline(transaction=False) as pipe:
        for key, value in values:
            if get:
                pipe.set(key, value, ex=expires, get=True)
            else:
                pipe.set(key, value, ex=expires)
            pipe.publish(key, value)
        return list(pipe.execute())


SUCCESS = states.SUCCESS
FAILURE = states.FAILURE
REVOKED = states.REVOKED
