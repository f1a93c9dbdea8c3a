"""Where a running copy is cancelled (L2, ``on_duplicate = "cancel_running"``).

At dispatch (:func:`cancelled_by`): the lock passed to the new dispatch and the key's running
copy was asked to stop, in one store call (``store.cancel_take``, ``engine/dispatch.py``);
here ``unique_job_cancelled`` is sent, the decision counted, and with ``cancel_terminates``
the run's result is marked REVOKED and a terminate sent (the prefork pool kills the process
that runs it; its worker's main process keeps that mark when Celery announces the
termination (``request.py``, :func:`terminated_reason`), releases what the run held and names
the copy queued now: ``handlers.py``, ``UniqueJob.release_dropped``, :func:`name_canceller`).

At the worker (:func:`end_cancelled`): the run's lease renewal reads the request back
(``Renewed.cancel``), so ``self.cancel_requested()`` turns true within a third of the lease;
when the body then ends, its result is REVOKED naming the new dispatch. The new dispatch's
message waits on the running marker (R2, ``engine/start.py``) until the run has ended: it
never runs beside it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

from celery.backends.base import DisabledBackend
from celery.exceptions import Ignore, Reject, Retry
from celery.states import REVOKED

from dedup_jobs import metrics
from dedup_jobs.exceptions import StoreUnavailable
from dedup_jobs.jobs.base import logger
from dedup_jobs.keys import JobKey
from dedup_jobs.signals import notify, unique_job_cancelled
from dedup_jobs.stores.base import BaseStore, running_key

if TYPE_CHECKING:
    from dedup_jobs.jobs.unique import UniqueJob


_REASON_START = "cancelled by task "


def _reason(by: str, key: str) -> str:
    return f"{_REASON_START}{by} (on_duplicate='cancel_running', lock {key})"


def cancelled_by(job: UniqueJob, key: JobKey, cancelled: str, task_id: str) -> None:
    """L2: ``task_id``'s dispatch asked the running ``cancelled`` to stop."""
    observed = job.observing()
    metrics.decision(job.name, "cancelled", key.key)
    notify(unique_job_cancelled, type(job), cancelled_id=cancelled, by_id=task_id,
           key=key.key, observed=observed)
    if observed:
        logger.info("%s[%s]: observe-only: would have cancelled the running %s (%s).",
                    job.name, task_id, cancelled, key.key)
        return
    logger.info("%s[%s] asks the running %s to stop (%s); it runs after it.", job.name,
                task_id, cancelled, key.key)
    if not job.cancel_terminates:
        return
    if not job.ignore_result:
        job.backend.mark_as_revoked(cancelled, reason=_reason(task_id, key.key))
    try:
        job.app.control.revoke(cancelled, terminate=True, signal="SIGTERM")
    except Exception:
        logger.warning("%s[%s]: could not send the terminate of the running %s; it is asked "
                       "to stop at its next lease renewal.", job.name, task_id, cancelled,
                       exc_info=True)


def run_cancellable(job: UniqueJob, held: Any, key: JobKey, body: Callable[[], Any]) -> Any:
    """Run ``body`` under the lease ``held`` (``job.cancel_requested()`` reads it); if a
    dispatch asked the run to stop, its end — returned, or raised — is a cancelled one."""
    job.request.update(dedup_lease=held)
    owner = str(job.request.id)
    try:
        result = body()
    except (Retry, Ignore, Reject) as exc:
        # a retry of a run asked to stop (an explicit one, or autoretry_for turning the
        # body's error into one) was not sent (UniqueJob.apply_async): the run ends cancelled
        if isinstance(exc, Retry) and job.cancel_requested():
            end_cancelled(job, owner, held.cancel, key)
        raise
    except Exception:
        if not job.cancel_requested():
            raise
        end_cancelled(job, owner, held.cancel, key)
    if job.cancel_requested():
        end_cancelled(job, owner, held.cancel, key)
    return result


def name_canceller(job: UniqueJob, store: BaseStore, key: JobKey, owner: str) -> None:
    """L2, in the worker's main process, for a message it dropped (``cancel_terminates``:
    terminated): the copy queued under the key now, or, once it has started (the
    terminated process may have let go of its marker first), the one running, is the
    dispatch that cancelled ``owner``'s run (or one that replaced it since): ``owner``'s
    result is REVOKED naming it (Celery's own mark, made just before, kept the cancelling
    dispatch's reason where its result had one, :func:`terminated_reason`, else says
    "terminated"; a store that no longer holds either key leaves that mark as it is)."""
    if job.ignore_result or job.on_duplicate != CANCEL_RUNNING:
        return  # a run of a without_overlapping job, say, terminated by somebody's revoke
    try:
        for where in (key, running_key(key)):
            held = store.get(where)
            if held is not None and held.owner != owner:
                job.backend.mark_as_revoked(owner, reason=_reason(held.owner, key.key))
                return
    except StoreUnavailable:
        return


def terminated_reason(job: Any, owner: str, reason: str) -> str:
    """L2, in the worker's main process, as Celery marks a terminated run REVOKED: the
    reason the cancelling dispatch marked ``owner``'s result with before it sent the
    terminate (:func:`cancelled_by`), else Celery's own ``reason``. Read from the result
    itself, not the store: by the time the pool reports a process it terminated (late, on
    a loaded machine), its running marker may have expired and the cancelling dispatch may
    have run and ended, leaving nothing in the store to name it."""
    if (getattr(job, "on_duplicate", None) != CANCEL_RUNNING or job.ignore_result
            or isinstance(job.backend, DisabledBackend)):  # no result to read
        return reason
    try:
        meta = job.backend.get_task_meta(owner)
    except Exception:
        logger.warning("%s[%s]: could not read the result of the terminated run.", job.name,
                       owner, exc_info=True)
        return reason
    marked = str(meta.get("result")) if meta.get("status") == REVOKED else ""
    return marked if marked.startswith(_REASON_START) else reason


def end_cancelled(job: UniqueJob, owner: str, by: str, key: JobKey) -> NoReturn:
    """L2: the run of ``owner`` ended after ``by`` asked it to stop: its result is REVOKED
    naming ``by`` (what the body returned or raised is dropped)."""
    logger.info("%s[%s]: cancelled by %s; its result is REVOKED.", job.name, owner, by)
    if not job.ignore_result:
        job.backend.mark_as_revoked(owner, reason=_reason(by, key.key))
    raise Ignore()


#: the on_duplicate that cancels a running copy
CANCEL_RUNNING = "cancel_running"
#: the on_duplicate choices that take a queued holder's lock over (R1)
REPLACING = ("replace", CANCEL_RUNNING)


def releases_on_start(job: UniqueJob) -> bool:
    """Is the lock released at the worker's start? UniqueUntilProcessingJob's always; a
    ``cancel_running`` job's too: the lock stands for the copy queued next, the running
    marker for the one running (L2)."""
    return bool(job.release_on_start or job.on_duplicate == CANCEL_RUNNING)


def runs_exclusive(job: UniqueJob) -> bool:
    """Does a run hold the key's running marker, so that no two runs overlap (R2; L2: the
    copy that cancelled a run waits on it)?"""
    return bool((job.without_overlapping and job.release_on_start)
                or job.on_duplicate == CANCEL_RUNNING)
