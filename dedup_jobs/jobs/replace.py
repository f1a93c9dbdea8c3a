"""Where a queued holder is replaced at dispatch (R1, ``on_duplicate = "replace"``): the lock
passed to the new dispatch in one store call (``store.take_over``); here the replaced message
is told — its result REVOKED at once, a revoke sent — and ``unique_job_replaced`` is sent. The
worker-side check (jobs/admission.py) alone keeps it from running."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dedup_jobs import metrics
from dedup_jobs.jobs.base import logger
from dedup_jobs.keys import JobKey
from dedup_jobs.signals import notify, unique_job_replaced

if TYPE_CHECKING:
    from dedup_jobs.jobs.unique import UniqueJob


def replaced_by(job: UniqueJob, key: JobKey, replaced: str, task_id: str) -> None:
    """R1: the lock passed from the queued ``replaced`` to ``task_id``. Its result is
    REVOKED at once and a revoke is sent; the worker-side check alone keeps it from
    running (the lock is no longer its own, its result already REVOKED)."""
    observed = job.observing()
    metrics.decision(job.name, "replaced", key.key)
    notify(unique_job_replaced, type(job), replaced_id=replaced, by_id=task_id,
           key=key.key, observed=observed)
    if observed:
        logger.info("%s[%s]: observe-only: would have replaced the queued %s (%s); both "
                    "run.", job.name, task_id, replaced, key.key)
        return
    logger.info("%s[%s] replaces the queued %s (%s).", job.name, task_id, replaced,
                key.key)
    if not job.ignore_result:
        job.backend.mark_as_revoked(
            replaced, reason=f"replaced by task {task_id} (on_duplicate='replace', lock "
                             f"{key.key})")
    try:
        job.app.control.revoke(replaced)
    except Exception:
        logger.warning("%s[%s]: could not send the revoke of the replaced %s; the "
                       "worker-side check skips it.", job.name, task_id, replaced,
                       exc_info=True)
