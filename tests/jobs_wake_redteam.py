"""Jobs of tests/test_throttle_wake_faults.py (red-team of the throttle's wake, T2). The subprocess
workers import this module with ``-I tests.jobs_wake_redteam``."""

from __future__ import annotations

import os
import time

from celery import shared_task

from dedup_jobs import ThrottledJob
from tests.jobs import hold_until_set, record


@shared_task(base=ThrottledJob, name="tests.redteam_rate_limited_one_at_once", concurrency=1,
             throttle_on=("account",), rate_limit="1/s")
def rate_limited_one_at_once(account: int, tag: int = 0, seconds: float = 0.0) -> int:
    """concurrency=1 per account, and Celery's own worker rate limit (a token bucket per task
    name on each worker): a deferred message's ETA goes through ``limit_post_eta``."""
    start = time.time()
    time.sleep(seconds)
    record("redteam_rl", (account, tag, start, time.time(), os.getpid()))
    return tag


@shared_task(base=ThrottledJob, name="tests.redteam_one_at_once", concurrency=1)
def one_at_once(tag: int = 0, seconds: float = 0.0, until: str = "") -> int:
    """Runs ``seconds``, or, given ``until``, until that key is set in the runs database
    (the test ends the run once its waiters are held; at most 60 s)."""
    start = time.time()
    time.sleep(seconds)
    hold_until_set(until, start)
    record("redteam_one", (tag, start, time.time()))
    return tag


@shared_task(base=ThrottledJob, name="tests.redteam_two_at_once_until", concurrency=2)
def two_at_once_until(tag: int = 0, until: str = "", seconds: float = 0.0) -> int:
    """concurrency=2; the body runs until the key ``until`` is set in the runs database (at
    most 60 s), then ``seconds`` more: runs that end together, as runs waiting on one
    external event (a batch, a shared resource) do."""
    start = time.time()
    hold_until_set(until, start, interval=0.005)
    time.sleep(seconds)
    record("redteam_two", (tag, start, time.time()))
    return tag


@shared_task(base=ThrottledJob, name="tests.redteam_retrying_one_at_once", concurrency=1,
             bind=True, max_retries=3)
def retrying_one_at_once(self: ThrottledJob, tag: int = 0, seconds: float = 0.0,
                         retry_countdown: float = 0.0) -> int:
    """concurrency=1; retries once with ``retry_countdown`` (T2: the retry keeps its slot)."""
    start = time.time()
    time.sleep(seconds)
    record("redteam_retry", (tag, self.request.retries, start, time.time()))
    if retry_countdown and self.request.retries == 0:
        raise self.retry(countdown=retry_countdown)
    return tag
