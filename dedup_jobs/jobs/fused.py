"""Where a unique dispatch is fused (issue 26, docs/semantics.md#fused): the lock and the
message in one round trip, when the Celery broker is kombu's Redis transport with this app's
channel (``CELERY_BROKER_TRANSPORT = "dedup_jobs.transport:Transport"``) on the store's own
Redis server.

:func:`dispatch_fused` publishes the message as Celery does, with a :class:`Pending` dispatch
in ``PENDING``: the channel (``jobs/transport.py``) hands the final message to the store's
FUSED script, which takes the lock and pushes the message, or finds the holder and pushes
nothing. Where the channel cannot fuse the message, nothing was sent: the dispatch goes the
two-round-trip way (``unique.py``), and so does every later one of that job on that store.

Faults (S7): a fused call that fails (never sent; its reply lost past the one re-send; its
reply late) leaves the lock and the message both or neither, and raises StoreUnavailable
(or, with ``ON_STORE_ERROR = "enqueue"``, publishes without a lock). Its undo, by the rollback
thread once the store answers, takes the message back off the queue if no worker has it yet
and then the lock (``UNFUSE``); the id is marked REVOKED only then: a dispatch deduplicated onto
it meanwhile gets an answer. When a worker has the message, the job runs and its result
resolves the caller's."""

from __future__ import annotations

from typing import Any

from celery.result import AsyncResult
from kombu.transport import resolve_transport

from dedup_jobs import clock, metrics
from dedup_jobs.conf import app_settings
from dedup_jobs.engine.dispatch import Dispatch
from dedup_jobs.exceptions import StoreUnavailable
from dedup_jobs.jobs.base import logger
from dedup_jobs.jobs.undo import undo_fused
from dedup_jobs.signals import lock_acquired, notify

#: (job name, store object id) -> why its messages cannot be fused (found by a first try)
_refused: dict[tuple[str, int], str] = {}
#: (job name, store object id) -> the share of its recent dispatches that were duplicates
#: (a moving average over about the last 32)
_duplicates: dict[tuple[str, int], float] = {}
#: above this share of duplicates the job's dispatches take two round trips: a fused
#: duplicate has Celery build the message it then throws away (~500 us of CPU), where the
#: other path answers a duplicate in one round trip without building one; one fused first
#: dispatch saves about a round trip and a third of that (docs/benchmarks.md#fused)
MOSTLY_DUPLICATES = 0.2


def observed(job: Any, store: Any, duplicate: bool) -> None:
    """Count one dispatch of ``job`` on ``store`` (a duplicate or not), on either path, where
    the fused transport is named."""
    if not fused_transport(job.app):
        return
    key = (job.name, id(store))
    share = _duplicates.get(key, 0.0)
    _duplicates[key] = share + ((1.0 if duplicate else 0.0) - share) / 32


def fused_transport(app: Any) -> bool:
    """Does the Celery ``app`` publish through this app's transport (read once per app)?"""
    found = getattr(app, "_dedup_fused", None)
    if found is None:
        found = False
        name = app.conf.broker_transport
        if name:  # (kombu's Redis transport is imported only by those who name this one)
            try:
                cls = resolve_transport(name)
                ours = transport_module().Transport
            except (KeyError, ImportError, AttributeError):
                cls = ours = None
            # (protocol 1 carries the task id in the body: the channel could not tell the
            # dispatch's message from another)
            found = (isinstance(cls, type) and ours is not None and issubclass(cls, ours)
                     and app.conf.task_protocol == 2)
        app._dedup_fused = found
    return bool(found)


def transport_module() -> Any:
    """``jobs/transport.py``, imported on first use: it imports kombu's Redis transport,
    which needs redis-py (not a dependency of a project on the database store)."""
    from dedup_jobs.jobs import transport

    return transport


def refuse(job: Any, store: Any, alias: str, why: Exception) -> None:
    """The transport found that ``job``'s messages cannot be fused on ``store`` (a first try
    sent nothing): its dispatches take two round trips from now on."""
    _refused[(job.name, id(store))] = str(why)
    logger.info("%s: not fused on store %r (%s): two round trips per dispatch.",
                job.name, alias, why)


def why_not_fused_job(job: Any, store: Any, *, batch: bool = False) -> str:
    """Why no dispatch of ``job`` on ``store`` is fused ("" when its dispatches can be);
    ``batch``: a batch's (``dispatch_many``), whose duplicates cost little either way."""
    if not fused_transport(job.app):
        return "the broker transport is not dedup_jobs.transport:Transport"
    if getattr(store, "fused_database", None) is None or store.fused_database() is None:
        return f"its store {store.alias!r} is not a Redis store of one server"
    if job.on_duplicate not in ("return", "raise"):
        return f"on_duplicate = {job.on_duplicate!r}"
    if job.observing():
        return "observe-only"
    key = (job.name, id(store))
    if not batch and _duplicates.get(key, 0.0) > MOSTLY_DUPLICATES:
        return (f"{_duplicates[key]:.0%} of its recent dispatches were duplicates, which "
                f"cost less on the two-round-trip path")
    return _refused.get(key, "")


def why_not_fused(job: Any, store: Any, options: dict[str, Any], *,
                  batch: bool = False) -> str:
    """Why this dispatch of ``job`` takes two round trips ("" when it can be fused)."""
    why = why_not_fused_job(job, store, batch=batch)
    if why:
        return why
    if options.get("group_id") or options.get("chord") or "chain" in options:
        return "a canvas (its id is frozen in a result somebody waits on)"
    producer = options.get("producer")
    if producer is not None and not isinstance(getattr(producer, "channel", None),
                                               transport_module().Channel):
        return "a producer of another transport"
    if options.get("connection") is not None or job.app.conf.task_always_eager:
        return "an explicit connection, or eager mode"
    return ""


def try_fused(job: Any, store: Any, dispatch: Dispatch, args: Any, kwargs: Any,
              alias: str, options: dict[str, Any]) -> AsyncResult[Any] | None:
    """The fused dispatch where it applies (:func:`why_not_fused`), else None: the caller
    takes the two-round-trip way."""
    if not fused_transport(job.app) or why_not_fused(job, store, options):
        return None
    return dispatch_fused(job, store, dispatch, args, kwargs, alias, options)


def dispatch_fused(job: Any, store: Any, dispatch: Dispatch, args: Any, kwargs: Any,
                   alias: str, options: dict[str, Any]) -> AsyncResult[Any] | None:
    """The fused dispatch: the caller's result, or None when the message could not be fused
    (nothing sent: the caller takes the two-round-trip way)."""
    transport = transport_module()
    pending = transport.Pending(store=store, key=dispatch.key, owner=dispatch.task_id,
                                ttl=dispatch.ttl, request=dispatch.request)
    failure: StoreUnavailable | None = None
    token = transport.PENDING.set(pending)
    try:
        result: AsyncResult[Any] = job._publish(args, kwargs, dispatch.task_id, dispatch.key,
                                                alias, options)
    except transport.Unfusable as exc:
        refuse(job, store, alias, exc)
        return None
    except StoreUnavailable as exc:
        failure = exc
    finally:
        transport.PENDING.reset(token)
    if failure is not None:
        failed: AsyncResult[Any] = _failed(job, store, pending, failure,
                                           (args, kwargs, alias, options))
        return failed
    if pending.answer is None:
        # The channel was not reached (cannot happen with the checks of why_not_fused): the
        # message went out as a plain one. Its lock is taken now; a worker skips it if
        # another owner holds the key (W3).
        logger.warning("%s[%s]: the message was not fused; locking it after publishing.",
                       job.name, dispatch.task_id)
        answer = dispatch.ask(store, now=clock.now())
    else:
        answer = dispatch.read(pending.answer)
    observed(job, store, not answer.publish)
    if not answer.publish:
        parent = job.app.current_worker_task if options.get("add_to_parent", True) else None
        if parent:  # Celery built its message (and trailed it); its id is never published
            untrail(parent, dispatch.task_id)
        duplicate: AsyncResult[Any] = job._duplicate(
            dispatch.key, alias, answer.holder, dispatch.task_id, args, kwargs, options)
        return duplicate
    notify(lock_acquired, type(job), key=dispatch.key.key, owner=dispatch.task_id, store=alias)
    metrics.decision(job.name, "dispatched")
    result.deduplicated = False  # type: ignore[attr-defined]
    return result


def untrail(parent: Any, owner: str) -> None:
    """Take the result of ``owner``, a dispatch found a duplicate after Celery built its
    message (its id never published), off its parent task's trail."""
    children = getattr(parent.request, "children", None)
    if children:
        children[:] = [c for c in children if getattr(c, "id", None) != owner]


def _failed(job: Any, store: Any, pending: Any, failure: StoreUnavailable,
            publish: tuple[Any, Any, str, dict[str, Any]]) -> Any:
    """The fused call failed: its undo handed to the rollback thread, then raise (or publish
    without a lock, ON_STORE_ERROR = "enqueue")."""
    enqueue = app_settings.ON_STORE_ERROR == "enqueue"
    if pending.call is not None:
        undo_fused(job, store, pending.call, revoke=not enqueue)
    if not enqueue:
        raise failure
    args, kwargs, alias, options = publish
    logger.warning("%s[%s]: store %r unavailable, publishing without a lock "
                   "(ON_STORE_ERROR='enqueue').", job.name, pending.owner, alias,
                   exc_info=failure)
    result = job._publish(args, kwargs, pending.owner, pending.key, alias, options)
    metrics.decision(job.name, "dispatched")
    result.deduplicated = False
    return result
