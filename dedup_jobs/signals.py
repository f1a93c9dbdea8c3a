"""Signals sent by dedup_jobs. Every signal is sent with ``sender=`` the task class (for a
Django task, SPEC K4: the task itself) and
keyword arguments only, among them ``observed``: False, or True when the decision was only
observed (observe-only mode, R3: reported, nothing dropped, deferred, replaced or raised)."""

from __future__ import annotations

import logging
from typing import Any

from django.dispatch import Signal

logger = logging.getLogger("dedup_jobs")

# A dispatch or a message was not run because another copy holds the lock.
# kwargs: task_id (the skipped dispatch/message), holder_id (owner of the lock), key,
# stage ("dispatch" or "worker"), observed.
unique_job_skipped = Signal()

# A dispatch of a DebouncedJob was superseded by a later one of the same burst.
# kwargs: debounce_id, superseded_id, by_id, key, observed.
job_debounced = Signal()

# A lock was taken. kwargs: key, owner, store (the store alias), observed.
lock_acquired = Signal()

# A lock was released by its owner or an operator. kwargs: key, owner, store,
# reason ("success", "failure", "processing", "admin" or "command"), observed.
lock_released = Signal()

# A running job's lease found its lock held by another owner (the lock had vanished and the key
# was taken meanwhile): the lease stops, the other owner's lock is left alone, the body runs on.
# kwargs: key, owner (the running job's task id), store (the store alias), holder (the other
# owner), observed (always False: a lost lock is a fact, not a policy decision).
# Sent from the lease's own thread (prefork, threads, solo) or, under gevent and eventlet, from
# a green thread of the worker once the hub runs (see docs/signals.md).
lock_lost = Signal()

# A dispatch of a job with on_duplicate = "replace" took the lock over from a queued copy
# (R1): the replaced message is revoked (its result REVOKED, naming by_id) and never runs.
# kwargs: replaced_id (the queued copy's task id), by_id (the new dispatch), key, observed
# (True in observe-only mode, R3: the lock passed, nothing was revoked).
unique_job_replaced = Signal()

# A dispatch of a job with on_duplicate = "cancel_running" asked the running copy of its key to
# stop (L2): the copy's cancel_requested() turns true at its next lease renewal (with
# cancel_terminates, a terminate is sent), its result ends REVOKED naming by_id, and the new
# dispatch runs after it. Sent once per running copy, by the dispatch that first asked it.
# kwargs: cancelled_id (the running copy's task id), by_id (the new dispatch), key, observed
# (True in observe-only mode, R3: the run is not stopped).
unique_job_cancelled = Signal()

# A message reached a worker but waits: re-published with a countdown, same task id (R2).
# kwargs: task_id, key, reason ("overlap": another run of its key is in progress), until
# (epoch seconds, when it is checked again), observed (True in observe-only mode, R3: it ran
# at once instead).
job_deferred = Signal()


def notify(signal: Signal, sender: Any, **kwargs: Any) -> None:
    """Send one of our signals without letting a failing receiver break the lock's life
    cycle (a raising receiver between taking a lock and publishing would otherwise leave a
    lock with nothing queued): receivers' errors are logged on the dedup_jobs logger. Every
    signal carries ``observed`` (False unless the caller says so, R3)."""
    if not signal.receivers:  # nobody listens (the usual case): skip the dispatch machinery
        return
    kwargs.setdefault("observed", False)
    for receiver, response in signal.send_robust(sender=sender, **kwargs):
        if isinstance(response, Exception):
            logger.error(
                "dedup_jobs signal receiver %r raised %r (sender %s, %s)",
                receiver,
                response,
                getattr(sender, "name", sender),
                kwargs,
                exc_info=(type(response), response, response.__traceback__),
            )
