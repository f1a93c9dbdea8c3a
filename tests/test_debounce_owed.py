"""D4: every dispatch of a burst gets the burst's outcome, also when the claimed run's retry
message is revoked or expires (it answers for the burst's absorbed dispatches, whose state
went at the claim), and when the burst's first dispatch passed ignore_result=True for
itself. From a red-team of DebouncedJob; each test failed before its fix (the absorbed
dispatch stayed PENDING) on every store it ran on (the fix is the Celery side's: these run
on the default store)."""

from __future__ import annotations

from typing import Any

import pytest
from celery import shared_task
from celery.exceptions import TaskRevokedError
from celery.result import AsyncResult
from django.core.cache import caches

from dedup_jobs import DebouncedJob
from tests.jobs_debounce import record, values
from tests.workers import thread_worker, wait_for

pytestmark = [pytest.mark.redis, pytest.mark.worker]


@pytest.fixture(autouse=True)
def _empty_locmem() -> None:
    caches["locmem"].clear()


@shared_task(bind=True, base=DebouncedJob, debounce_for=0.5, debounce_on=("item",),
             max_retries=1, name="tests.debounce_slow_retry")
def debounce_slow_retry(self: DebouncedJob, item: int, value: int) -> int:
    record("debounce_slow_retry", [value, self.request.retries])
    if self.request.retries == 0:
        raise self.retry(countdown=3.0)
    return value


@shared_task(base=DebouncedJob, debounce_for=0.6, debounce_on=("item",),
             name="tests.debounce_plain")
def debounce_plain(item: int, value: int = 0) -> int:
    record("debounce_plain", [item, value])
    return value


def _answered(app: Any, task_id: str) -> bool:
    return AsyncResult(task_id, app=app).state != "PENDING"


@pytest.mark.parametrize("end", ["expired", "revoked"])
def test_a_retry_of_a_burst_that_never_runs_answers_its_absorbed_dispatches(
        app: Any, end: str) -> None:
    """The claimed run retries (countdown 3 s); its retry message expires (the first
    dispatch's expires=2) or is revoked by the burst's message id (the documented way to
    revoke a burst) before it runs: the burst's own id ends REVOKED, and so does the
    absorbed dispatch."""
    item = 1 if end == "expired" else 2
    first = debounce_slow_retry.apply_async(
        (item, 0), **({"expires": 2.0} if end == "expired" else {}))
    second = debounce_slow_retry.delay(item, 1)
    with thread_worker(app):
        wait_for(lambda: values("debounce_slow_retry"), timeout=10)
        if end == "revoked":
            app.control.revoke(first.id)
        with pytest.raises(TaskRevokedError):
            first.get(timeout=10)
        wait_for(lambda: _answered(app, second.id), timeout=10)
    with pytest.raises(TaskRevokedError, match=first.id):
        second.get(timeout=1)


def test_a_first_dispatch_that_ignores_its_result_leaves_the_others_answered(
        app: Any) -> None:
    """The burst's first dispatch passes ignore_result=True for itself; a later dispatch
    that did not still gets the run's result (it waited forever)."""
    debounce_plain.apply_async((3, 0), ignore_result=True)
    second = debounce_plain.delay(3, 1)
    with thread_worker(app):
        assert second.get(timeout=15) == 1
    assert values("debounce_plain") == [[3, 1]]  # one run, with the last arguments
