"""Where a unique Django task is checked when the backend's worker starts it (K2, W1/W3), run
under its lease (W6) and released when it ends, succeeded or failed.

The framework sends ``task_started`` (with the result, hence the owner) right before the
worker calls ``task.call(...)``; :func:`on_started` keeps that result for the thread, and the
task's ``call`` (``tasks.py``) hands it to :func:`run_checked`:

- the check is the engine's :class:`~dedup_jobs.engine.start.Check`, one store call
  (``store.start``; until-processing: it releases the lock, W1);
- another owner holds the key (a row enqueued around the decorator, or a copy whose lock was
  lost): the body does not run, ``DuplicateJob`` is raised, so the backend records the result
  FAILED, naming the holder (W3);
- the store cannot answer: the body runs, and the lease thread re-sends the same check until
  the store answers and holds what it granted (W4, ``engine/lease.py``);
- the lock is renewed while the body runs and released by its owner when it ends.

A call not started by a worker (``task.call(...)`` in a shell or a test) runs plainly."""

from __future__ import annotations

import threading
from typing import Any

from dedup_jobs.conf import app_settings
from dedup_jobs.django_tasks.enqueue import logger, released
from dedup_jobs.django_tasks.options import UniqueOptions
from dedup_jobs.engine.lease import leases
from dedup_jobs.engine.limits import seconds_at_worker
from dedup_jobs.engine.start import Check
from dedup_jobs.exceptions import DuplicateJob, StoreUnavailable
from dedup_jobs.signals import lock_acquired, lock_released, notify, unique_job_skipped
from dedup_jobs.stores.answers import StartAnswer
from dedup_jobs.stores.base import new_request_id

_local = threading.local()


def on_started(sender: Any, task_result: Any, **kwargs: Any) -> None:
    """``task_started``: the result the worker is about to call this thread's task for."""
    _local.started = task_result


def started_result(task: Any) -> Any:
    """The result a worker started ``task`` for in this thread (taken: a later plain call
    of the task is not mistaken for it), or None."""
    result = getattr(_local, "started", None)
    if result is None or result.task.module_path != task.module_path:
        return None
    _local.started = None
    return result


def run_checked(task: Any, options: UniqueOptions, result: Any, call: Any) -> Any:
    """Check the lock of ``result``, then ``call()`` under its lease; released at the end."""
    owner = str(result.id)
    try:
        store = options.store()
        key = options.key(result.args, result.kwargs, store)
    except Exception:
        # W4: a task enqueued around the decorator whose key cannot be computed runs
        logger.warning("%s[%s]: no dedup key could be computed; running unchecked.",
                       options.label, owner, exc_info=True)
        return call()
    check = Check(key=key, owner=owner, delivery=new_request_id(), exclusive=False,
                  release=options.release_on_start, redelivered=False)
    resend = None
    try:
        started = check(store)
    except StoreUnavailable:
        logger.warning("%s[%s]: store %r unavailable at the worker check; running (what the "
                       "check did is settled when the store answers).", options.label,
                       owner, store.alias, exc_info=True)
        resend = check.holds_after
    else:
        if started.answer is not StartAnswer.RUN:
            holder = str(started.holder)
            notify(unique_job_skipped, task, task_id=owner, holder_id=holder, key=key.key,
                   stage="worker")
            raise DuplicateJob(options.label, key.key, holder)
        if started.took:
            notify(lock_acquired, task, key=key.key, owner=owner, store=store.alias)
        if started.released:
            notify(lock_released, task, key=key.key, owner=owner, store=store.alias,
                   reason="processing")
        if options.release_on_start:
            return call()
    held: Any = None
    reason = "failure"
    try:
        with leases.hold(store, key, owner, app_settings.LEASE_SECONDS, sender=task,
                         delivery=check.delivery, resend=resend) as held:
            value = call()
        reason = "success"
        return value
    finally:
        if held is None or held.granted is not False:
            released(task, options.label, store, key, owner,
                     "processing" if options.release_on_start else reason,
                     seconds_at_worker(options.label, "unique_for", options.unique_for,
                                       result.args, result.kwargs,
                                       app_settings.DEFAULT_UNIQUE_FOR))
