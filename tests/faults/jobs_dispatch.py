"""Jobs of the dispatch-fate tests (tests/faults/test_dispatch_fates.py): a replace UniqueJob.
Its body is recorded like every fault job (tests/faults/jobs.py: ``bodies``). Imported by the
test process and, through ``CELERY_IMPORTS`` of tests/faults/settings_dispatch.py, by the
subprocess worker of those tests."""

from __future__ import annotations

from celery import shared_task

from dedup_jobs import UniqueJob
from tests.faults.jobs import _body


@shared_task(
    bind=True,
    base=UniqueJob,
    unique_for=60,
    unique_on=("token",),
    on_duplicate="replace",
    name="tests.faults.replace",
)
def fault_replace(self: UniqueJob, token: str, value: int = 0) -> int:
    """A UniqueJob with ``on_duplicate = "replace"`` (R1)."""
    _body(self, token, 0.0, "", value)
    return value
