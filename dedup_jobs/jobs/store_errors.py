"""What a worker does when a decision of its admission cannot reach the store (the call
raised StoreUnavailable: never sent, its reply lost, or its reply late — the store may or may
not have run it).

- W4, a unique kind's lock check: the body runs; the lease thread re-sends the same call
  (``jobs/lease.py``) and holds what the answer granted; :func:`holds_after` reads that answer.
- W7, a limit's admission (``concurrency``, ``throttle``, ``without_overlapping``): the message
  waits for the store (:func:`defer_for_store`), re-published with the same task id, unless
  ``DEDUP_JOBS["LIMITS_ON_STORE_ERROR"] = "run"``.

Nothing here runs for a message whose store calls answered: the normal path pays nothing.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from celery.exceptions import Ignore

from dedup_jobs import clock, metrics
from dedup_jobs.conf import app_settings
from dedup_jobs.jobs.base import logger
from dedup_jobs.keys import JobKey
from dedup_jobs.signals import job_deferred, notify
from dedup_jobs.stores.base import Started


def holds_after(started: Started, released: bool) -> bool:
    """W4: does the answer of a re-sent check leave the running job something to hold (the
    lock or the running marker, renewed and released like any)? A release at start
    (until-processing) leaves nothing: the re-send itself released the lock."""
    return started.run and not released


def defer_for_store(job: Any, key: JobKey, alias: str, what: str,
                    again: Callable[[float], None]) -> None:
    """W7: a limit's admission (``what``) could not reach the store. Publish the message again
    (``again(countdown)``, same task id) after a third of the lease plus up to 1 s of jitter
    and raise Ignore: a limit is never exceeded because the store blinked. Returns (the caller
    runs the message, logged) with ``LIMITS_ON_STORE_ERROR = "run"``, in observe-only mode
    (R3), or when the re-publish fails too: a message is never dropped."""
    owner = str(job.request.id)
    observing = bool(getattr(job, "observing", lambda: False)())
    if app_settings.LIMITS_ON_STORE_ERROR == "run":
        logger.warning("%s[%s]: store %r unavailable at the %s; running "
                       "(LIMITS_ON_STORE_ERROR='run').", job.name, owner, alias, what,
                       exc_info=True)
        return
    countdown = app_settings.LEASE_SECONDS / 3 + random.uniform(0, 1)
    metrics.decision(job.name, "deferred", key.key)
    notify(job_deferred, type(job), task_id=owner, key=key.key, reason="store_error",
           until=clock.now() + countdown, observed=observing)
    if observing:
        logger.info("%s[%s]: observe-only: would have waited %.1fs (store %r unavailable at "
                    "the %s); runs now.", job.name, owner, countdown, alias, what)
        return
    try:
        again(countdown)
    except Exception:
        logger.error("%s[%s]: store %r unavailable at the %s, and the message could not be "
                     "published again either; running it.", job.name, owner, alias, what,
                     exc_info=True)
        return
    logger.warning("%s[%s]: store %r unavailable at the %s; this message waits %.1fs.",
                   job.name, owner, alias, what, countdown, exc_info=True)
    raise Ignore()
