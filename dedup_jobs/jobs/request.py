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
from celery.worker import state
from celery.worker.request import Request

from dedup_jobs.jobs.base import HEADER


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

    def _release(self) -> None:
        release = getattr(self.task, "release_dropped", None)
        if release is not None:
            release(self.id, self.request_dict.get(HEADER), self.args, self.kwargs)
