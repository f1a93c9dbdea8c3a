"""Jobs used by the tests. Every execution is recorded in Redis so a test can count runs
across threads and processes."""

from __future__ import annotations

import time
from typing import Any

import redis
from celery import shared_task
from django.conf import settings

from dedup_jobs import UniqueJob, UniqueUntilProcessingJob

RUNS_DB = 12


def runs_client() -> redis.Redis:
    return redis.Redis.from_url(f"{settings.REDIS_URL}/{RUNS_DB}")


def record(name: str, value: Any) -> None:
    runs_client().rpush(f"runs:{name}", repr(value))


def runs(name: str) -> list[str]:
    return [v.decode() for v in runs_client().lrange(f"runs:{name}", 0, -1)]


def hold_until_set(key: str, started: float, interval: float = 0.01) -> None:
    """In a job body: wait until the test sets ``key`` in the runs database (the test ends
    the run when what it needs is in place), at most 60 s after ``started``."""
    while key and not runs_client().exists(key) and time.time() - started < 60:
        time.sleep(interval)


@shared_task(base=UniqueJob, unique_for=60, name="tests.unique_sleep")
def unique_sleep(item: int, seconds: float = 0.0) -> int:
    record("unique_sleep", item)
    time.sleep(seconds)
    return item


@shared_task(base=UniqueJob, unique_for=60, name="tests.unique_add", unique_on=("a",))
def unique_add(a: int, b: int = 0) -> int:
    record("unique_add", (a, b))
    return a + b


@shared_task(base=UniqueJob, unique_for=60, name="tests.unique_fail")
def unique_fail(item: int) -> None:
    record("unique_fail", item)
    raise ValueError(f"boom {item}")


@shared_task(bind=True, base=UniqueJob, unique_for=60, name="tests.unique_retry",
             max_retries=2, default_retry_delay=0)
def unique_retry(self: UniqueJob, item: int, fail_times: int = 1) -> int:
    record("unique_retry", (item, self.request.retries))
    if self.request.retries < fail_times:
        raise self.retry(countdown=0.5)
    return self.request.retries


@shared_task(bind=True, base=UniqueJob, unique_for=60, name="tests.unique_retry_nothrow",
             max_retries=1)
def unique_retry_nothrow(self: UniqueJob, item: int) -> str:
    record("unique_retry_nothrow", (item, self.request.retries))
    if self.request.retries == 0:
        self.retry(countdown=1.0, throw=False)
        return "retrying"
    return "done"


@shared_task(base=UniqueUntilProcessingJob, unique_for=60, name="tests.until_processing")
def until_processing(item: int, seconds: float = 0.0) -> int:
    record("until_processing", item)
    time.sleep(seconds)
    return item


@shared_task(bind=True, base=UniqueUntilProcessingJob, unique_for=60, max_retries=1,
             name="tests.until_processing_retry")
def until_processing_retry(self: UniqueUntilProcessingJob, item: int) -> int:
    record("until_processing_retry", (item, self.request.retries))
    if self.request.retries == 0:
        raise self.retry(countdown=0.5)
    return item


class RecalculateInvoice(UniqueJob):
    """Class style, with unique_id() and a raising on_duplicate."""

    name = "tests.recalculate_invoice"
    unique_for = 60
    on_duplicate = "raise"

    def unique_id(self, invoice_id: int, **kwargs: Any) -> str:
        return f"invoice-{invoice_id}"

    def run(self, invoice_id: int, note: str = "") -> int:
        record("recalculate_invoice", invoice_id)
        return invoice_id


def _register_class_jobs() -> None:
    from tests.celery_app import app

    app.register_task(RecalculateInvoice())


_register_class_jobs()


# the flow-control jobs (R1-R3) and the throttled jobs (T1-T5), for workers
from tests import jobs_flow, jobs_limits, jobs_throttle  # noqa: E402, F401
