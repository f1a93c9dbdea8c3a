"""The worker-side request of a unique job (it lives in the worker's main process).

Some ends of a job happen where the job's own release in ``UniqueJob.__call__`` cannot run:
the pool process was killed (OOM, SIGKILL: ``WorkerLostError``), or a hard time limit killed it
(a job stuck in a C call ignores the SIGTERM that comes first). The main process releases
instead (U4), compare-and-delete by the task id with the key carried in the message header, so
it never touches a newer owner's lock. A message that is redelivered or retried after this
re-takes the free lock at the worker-side check, as any message does.
"""

from __future__ import annotations

from typing import Any

from billiard.exceptions import WorkerLostError
from celery.states import READY_STATES
from celery.worker import state
from celery.worker.request import Request

from dedup_jobs.jobs.base import HEADER, logger
from dedup_jobs.jobs.cancel import terminated_reason

#: dedup header flag of a copy re-published to wait for its first delivery's run (W5): it
#: carries on that the broker had marked the copy redelivered
REDELIVERED = "redelivered"


class UniqueRequest(Request):
    """``UniqueJob.Request``: Celery's request plus the releases its pool process cannot do."""

    def on_timeout(self, soft: bool, timeout: float) -> None:
        super().on_timeout(soft, timeout)
        if not soft and not state.should_terminate:
            # A soft limit is raised inside the job, which releases as it fails.
            self._release()

    def on_failure(
        self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False
    ) -> None:
        exc = exc_info.exception
        exc = getattr(exc, "exc", exc)  # billiard's ExceptionWithTraceback wraps it
        if isinstance(exc, WorkerLostError):
            # Before Celery handles it: a retry_on_worker_lost retry then finds the lock free.
            self._release()
        super().on_failure(exc_info, send_failed_event=send_failed_event, return_ok=return_ok)

    def _announce_revoked(self, reason: str, terminated: bool, signum: Any,
                          expired: bool) -> None:
        """Celery marks a terminated run's result REVOKED "terminated": a run terminated by
        a cancelling dispatch (L2, ``cancel_terminates``) keeps the reason that dispatch
        marked before it sent the terminate, naming it (``jobs/cancel.py``)."""
        if terminated:
            reason = terminated_reason(self.task, self.id, reason)
        super()._announce_revoked(reason, terminated, signum, expired)  # type: ignore[misc]

    def _release(self) -> None:
        release = getattr(self.task, "release_dropped", None)
        if release is not None:
            release(self.id, self.request_dict.get(HEADER), self.args, self.kwargs)


def is_redelivered(request: Any, header: dict[str, Any] | None) -> bool:
    """The broker marked this delivery redelivered, or it is a copy that waited for its
    first delivery's run and carries that mark on (W5)."""
    if header is not None and header.get(REDELIVERED):
        return True
    return bool((getattr(request, "delivery_info", None) or {}).get("redelivered"))


def finished(job: Any, task_id: str) -> bool:
    """W5: has a run of ``task_id`` ended (its result is ready)? Asked only of a copy the
    broker marked redelivered; without a result (``ignore_result``, no backend) nobody can
    tell, and the copy goes on to the lock check (at least once)."""
    if job.ignore_result:
        return False
    try:
        return job.AsyncResult(task_id).state in READY_STATES
    except Exception:
        logger.warning("%s[%s]: could not read the result of the redelivered message.",
                       job.name, task_id, exc_info=True)
        return False
