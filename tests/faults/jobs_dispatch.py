"""Jobs of the dispatch-fate tests (tests/faults/test_dispatch_fates.py): a cancel_running
UniqueJob (their replace job is tests/faults/jobs.py's ``fault_replace``, one task name, one
callable).
Its body is recorded like every fault job (tests/faults/jobs.py: ``bodies``). Imported by the
test process and, through ``CELERY_IMPORTS`` of tests/faults/settings_dispatch.py, by the
subprocess worker of those tests."""

from __future__ import annotations

import os
import time

from celery import shared_task

from dedup_jobs import UniqueJob
from tests.faults.jobs import mark


@shared_task(
    bind=True,
    base=UniqueJob,
    unique_for=60,
    unique_on=("token",),
    on_duplicate="cancel_running",
    name="tests.faults.cancel",
)
def fault_cancel(self: UniqueJob, token: str, value: int = 0, seconds: float = 0.0) -> int:
    """A UniqueJob with ``on_duplicate = "cancel_running"`` (L2) whose body polls
    ``cancel_requested()`` every 50 ms for ``seconds``."""
    info = self.request.delivery_info or {}
    run = f"{os.getpid()}-{time.monotonic_ns()}"
    mark(token, "start", run=run, task_id=self.request.id, pid=os.getpid(), value=value,
         redelivered=bool(info.get("redelivered")))
    started = time.time()
    while time.time() < started + seconds and not self.cancel_requested():
        time.sleep(0.05)
    mark(token, "end", run=run, task_id=self.request.id)
    return value
