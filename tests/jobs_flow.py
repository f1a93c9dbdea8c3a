"""Jobs of the flow-control tests (R1-R3), registered through tests/jobs.py."""

from __future__ import annotations

import time

from celery import shared_task

from dedup_jobs import UniqueJob, UniqueUntilProcessingJob
from tests.jobs import record


@shared_task(base=UniqueJob, unique_for=60, name="tests.replace_latest", unique_on=("item",),
             on_duplicate="replace")
def replace_latest(item: int, value: int = 0) -> int:
    record("replace_latest", (item, value))
    return value


@shared_task(base=UniqueUntilProcessingJob, unique_for=60, name="tests.no_overlap",
             unique_on=("item",), without_overlapping=True)
def no_overlap(item: int, seconds: float = 0.0, tag: int = 0) -> int:
    start = time.time()
    time.sleep(seconds)
    record("no_overlap", (item, tag, start, time.time()))
    return tag


@shared_task(base=UniqueJob, unique_for=60, name="tests.observed", observe_only=True)
def observed(item: int) -> int:
    record("observed", item)
    return item


@shared_task(base=UniqueUntilProcessingJob, unique_for=60, name="tests.keep_last",
             unique_on=("item",), without_overlapping=True, on_duplicate="replace")
def keep_last(item: int, seconds: float = 0.0, tag: int = 0) -> int:
    start = time.time()
    time.sleep(seconds)
    record("keep_last", (item, tag, start, time.time()))
    return tag


@shared_task(bind=True, base=UniqueJob, unique_for=60, name="tests.cancel_latest",
             unique_on=("item",), on_duplicate="cancel_running")
def cancel_latest(self: UniqueJob, item: int, tag: int = 0, seconds: float = 0.0) -> int:
    """L2, a cooperative body: polls cancel_requested() every 50 ms for ``seconds``."""
    start = time.time()
    record("cancel_latest", (item, tag, "start", start))
    while time.time() < start + seconds:
        if self.cancel_requested():
            record("cancel_latest", (item, tag, "stopped", time.time()))
            return tag
        time.sleep(0.05)
    record("cancel_latest", (item, tag, "end", time.time()))
    return tag


@shared_task(base=UniqueJob, unique_for=60, name="tests.cancel_terminating",
             unique_on=("item",), on_duplicate="cancel_running", cancel_terminates=True)
def cancel_terminating(item: int, tag: int = 0, seconds: float = 0.0) -> int:
    """L2, a body that never looks: terminated on the prefork pool (cancel_terminates)."""
    record("cancel_terminating", (item, tag, "start", time.time()))
    time.sleep(seconds)
    record("cancel_terminating", (item, tag, "end", time.time()))
    return tag


@shared_task(bind=True, base=UniqueJob, unique_for=60, name="tests.cancel_autoretry",
             unique_on=("item",), on_duplicate="cancel_running",
             autoretry_for=(RuntimeError,), retry_kwargs={"countdown": 2, "max_retries": 3})
def cancel_autoretry(self: UniqueJob, item: int, tag: int = 0, seconds: float = 0.0) -> int:
    """A cooperative body that raises when asked to stop, on a task with Celery's
    autoretry_for (its RuntimeError becomes a retry)."""
    start = time.time()
    record("cancel_autoretry", (item, tag, "start", start))
    while time.time() < start + seconds:
        if self.cancel_requested():
            record("cancel_autoretry", (item, tag, "stopped", time.time()))
            raise RuntimeError("stopped on request")
        time.sleep(0.05)
    record("cancel_autoretry", (item, tag, "end", time.time()))
    return tag
