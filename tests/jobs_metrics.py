"""Jobs of the metrics tests (A5): a unique job keyed by (token, item) that records its runs."""

from __future__ import annotations

from celery import shared_task

from dedup_jobs import UniqueJob
from tests.jobs import record


@shared_task(base=UniqueJob, unique_for=60, unique_on=("token", "item"),
             name="tests.metrics_unique")
def metrics_unique(token: str, item: int) -> int:
    record(token, item)
    return item
