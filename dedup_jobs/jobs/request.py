"""The worker-side request of a unique job (it lives in the worker's main process).

A hard time limit kills the pool process that runs the job, so the job's own release in
``UniqueJob.__call__`` may never run (a job stuck in a C call ignores the SIGTERM that comes
first); the main process releases instead (U4), compare-and-delete by the task id, with the
key carried in the message header.
"""

from __future__ import annotations

from celery.worker import state
from celery.worker.request import Request

from dedup_jobs.jobs.base import HEADER


class UniqueRequest(Request):
    """``UniqueJob.Request``: Celery's request plus the release on a hard time limit."""

    def on_timeout(self, soft: bool, timeout: float) -> None:
        super().on_timeout(soft, timeout)
        if soft or state.should_terminate:
            return  # a soft limit is raised inside the job, which releases as it fails
        release = getattr(self.task, "release_dropped", None)
        if release is not None:
            release(self.id, self.request_dict.get(HEADER), self.args, self.kwargs)
