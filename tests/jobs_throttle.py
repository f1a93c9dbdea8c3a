"""Jobs of the throttling tests (T1-T5), registered through tests/jobs.py."""

from __future__ import annotations

import os
import time

from celery import shared_task

from dedup_jobs import DebouncedJob, ThrottledJob, UniqueJob
from tests.jobs import hold_until_set, record


@shared_task(base=ThrottledJob, name="tests.two_at_once", concurrency=2,
             throttle_on=("account",))
def two_at_once(account: int, tag: int = 0, seconds: float = 0.0) -> int:
    start = time.time()
    record("two_at_once", (account, tag, start, os.getpid(), "start"))
    time.sleep(seconds)
    # a deferred message is published again with a countdown: its delivery has an eta
    deferred = two_at_once.request.eta is not None
    record("two_at_once", (account, tag, start, time.time(), deferred))
    return tag


@shared_task(base=ThrottledJob, name="tests.five_per_second", throttle="5/s")
def five_per_second(tag: int = 0) -> int:
    record("five_per_second", (tag, time.time()))
    return tag


@shared_task(base=UniqueJob, unique_for=60, name="tests.unique_one_at_once",
             unique_on=("item",), concurrency=1)
def unique_one_at_once(item: int, seconds: float = 0.0) -> int:
    start = time.time()
    time.sleep(seconds)
    record("unique_one_at_once", (item, start, time.time()))
    return item


@shared_task(base=DebouncedJob, debounce_for=0.2, name="tests.debounced_throttled",
             throttle="1/s")
def debounced_throttled(item: int) -> int:
    record("debounced_throttled", (item, time.time()))
    return item


# -- benchmarks/throttle.py: one hot key, 1,000 messages ---------------------------------


@shared_task(base=ThrottledJob, name="tests.bench_two_at_once", concurrency=2)
def bench_two_at_once(tag: int = 0, seconds: float = 0.0) -> int:
    time.sleep(seconds)
    return tag


@shared_task(name="tests.bench_plain_sleep")
def bench_plain_sleep(tag: int = 0, seconds: float = 0.0) -> int:
    """benchmarks/throttle.py's reference: a plain Celery task, no limit."""
    time.sleep(seconds)
    return tag


@shared_task(base=ThrottledJob, name="tests.bench_ten_per_second", throttle="10/s")
def bench_ten_per_second(tag: int = 0) -> int:
    return tag


class PerPlanConcurrency(ThrottledJob):
    """L1: one run at a time per "free" plan, no limit for "vip" (only a limit method)."""

    name = "tests.per_plan_concurrency"
    throttle_on = ("plan",)

    def concurrency(self, plan: str, tag: int = 0, seconds: float = 0.0) -> int | None:
        return None if plan == "vip" else 1

    def run(self, plan: str, tag: int = 0, seconds: float = 0.0) -> int:
        start = time.time()
        time.sleep(seconds)
        record("per_plan_concurrency", (plan, tag, start, time.time()))
        return tag


class PerPlanRate(ThrottledJob):
    """L1: "2/s" per "free" plan, "5/m" per "pro", no limit for "vip"; "bad" returns a value
    that is no rate."""

    name = "tests.per_plan_rate"
    throttle_on = ("plan",)

    def throttle(self, plan: str, tag: int = 0) -> str | None:
        return {"free": "2/s", "pro": "5/m", "vip": None}.get(plan, "2 per second")

    def run(self, plan: str, tag: int = 0) -> int:
        record("per_plan_rate", (plan, tag, time.time()))
        return tag


def _register_class_jobs() -> tuple[PerPlanConcurrency, PerPlanRate]:
    from tests.celery_app import app

    found = app.register_task(PerPlanConcurrency()), app.register_task(PerPlanRate())
    return found  # type: ignore[return-value]


per_plan_concurrency, per_plan_rate = _register_class_jobs()


@shared_task(base=ThrottledJob, name="tests.one_at_once", concurrency=1)
def one_at_once(tag: int = 0, seconds: float = 0.0, until: str = "") -> int:
    """Runs ``seconds``, or, given ``until``, until that key is set in the runs database
    (the test ends the run once its waiter is held; at most 60 s)."""
    start = time.time()
    time.sleep(seconds)
    hold_until_set(until, start)
    deferred = one_at_once.request.eta is not None
    record("one_at_once", (tag, start, time.time(), deferred))
    return tag
