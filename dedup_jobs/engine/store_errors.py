"""What a worker does when a decision of its admission cannot reach the store (the call
raised StoreUnavailable: never sent, its reply lost, or its reply late — the store may or may
not have run it).

- W4, a unique kind's lock check: the body runs; the lease thread re-sends the same call
  (``engine/lease.py``) and holds what the answer granted (``engine/start.py``,
  ``Check.holds_after``).
- W7, a limit's admission (``concurrency``, ``throttle``, ``without_overlapping``): the message
  waits for the store (:func:`defer_for_store`), re-published with the same task id, unless
  ``DEDUP_JOBS["LIMITS_ON_STORE_ERROR"] = "run"``.

Nothing here runs for a message whose store calls answered: the normal path pays nothing.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from dedup_jobs import clock, metrics
from dedup_jobs.conf import app_settings
from dedup_jobs.engine.message import Message, logger
from dedup_jobs.keys import JobKey
from dedup_jobs.signals import job_deferred, notify


def defer_for_store(message: Message, key: JobKey, alias: str, what: str,
                    again: Callable[[float], None]) -> bool:
    """W7: a limit's admission (``what``) could not reach the store. Publish the message again
    (``again(countdown)``, same task id) after a third of the lease plus up to 1 s of jitter
    and answer True: the front-end ends this delivery; a limit is never exceeded because the
    store blinked. Answers False (the caller runs the message, logged) with
    ``LIMITS_ON_STORE_ERROR = "run"``, in observe-only mode (R3), or when the re-publish fails
    too: a message is never dropped."""
    name, owner, observing = message.name, message.owner, message.observing
    if app_settings.LIMITS_ON_STORE_ERROR == "run":
        logger.warning("%s[%s]: store %r unavailable at the %s; running "
                       "(LIMITS_ON_STORE_ERROR='run').", name, owner, alias, what,
                       exc_info=True)
        return False
    countdown = app_settings.LEASE_SECONDS / 3 + random.uniform(0, 1)
    metrics.decision(name, "deferred", key.key)
    notify(job_deferred, message.sender, task_id=owner, key=key.key, reason="store_error",
           until=clock.now() + countdown, observed=observing)
    if observing:
        logger.info("%s[%s]: observe-only: would have waited %.1fs (store %r unavailable at "
                    "the %s); runs now.", name, owner, countdown, alias, what)
        return False
    try:
        again(countdown)
    except Exception:
        logger.error("%s[%s]: store %r unavailable at the %s, and the message could not be "
                     "published again either; running it.", name, owner, alias, what,
                     exc_info=True)
        return False
    logger.warning("%s[%s]: store %r unavailable at the %s; this message waits %.1fs.",
                   name, owner, alias, what, countdown, exc_info=True)
    return True
