"""UniqueJob and UniqueUntilProcessingJob with a real worker, on every store."""

from __future__ import annotations

from typing import Any

import pytest
from celery.exceptions import TaskRevokedError
from celery.worker import state as worker_state

from dedup_jobs.signals import lock_released
from tests import jobs
from tests.workers import thread_worker, wait_for

pytestmark = [pytest.mark.redis, pytest.mark.worker]


def lock_of(task: Any, *args: Any, **kwargs: Any) -> Any:
    return task.store().get(task.job_key(args, kwargs))


def test_release_on_success(app: Any, store_name: str) -> None:
    """U4: the lock is released when the job succeeds; a later dispatch runs again."""
    first = jobs.unique_sleep.delay(1)
    assert lock_of(jobs.unique_sleep, 1) is not None
    with thread_worker(app):
        assert first.get(timeout=20) == 1
        assert lock_of(jobs.unique_sleep, 1) is None
        second = jobs.unique_sleep.delay(1)
        assert second.deduplicated is False
        assert second.get(timeout=20) == 1
    assert jobs.runs("unique_sleep") == ["1", "1"]


def test_release_on_final_failure(app: Any, store_name: str) -> None:
    """U4: the lock is released when the job fails for good."""
    released: list[dict[str, Any]] = []

    def on_release(**kwargs: Any) -> None:
        released.append(kwargs)

    lock_released.connect(on_release, weak=False)
    try:
        result = jobs.unique_fail.delay(5)
        with thread_worker(app):
            with pytest.raises(ValueError, match="boom 5"):
                result.get(timeout=20)
            wait_for(lambda: lock_of(jobs.unique_fail, 5) is None)
    finally:
        lock_released.disconnect(on_release)
    assert [r["reason"] for r in released] == ["failure"]
    assert released[0]["owner"] == result.id


def test_retry_keeps_the_lock(app: Any, store_name: str) -> None:
    """U4: self.retry() keeps the lock; the retry is not blocked by it; a dispatch during
    the retry wait is deduplicated to the retrying task; released after success."""
    result = jobs.unique_retry.delay(7, fail_times=1)
    with thread_worker(app):
        wait_for(lambda: len(jobs.runs("unique_retry")) == 1)
        during = jobs.unique_retry.delay(7, fail_times=1)
        assert during.deduplicated is True
        assert during.id == result.id
        assert result.get(timeout=20) == 1
        wait_for(lambda: lock_of(jobs.unique_retry, 7, fail_times=1) is None)
    assert jobs.runs("unique_retry") == ["(7, 0)", "(7, 1)"]


def test_until_processing_releases_before_run(app: Any, store_name: str) -> None:
    """P1: the lock is released just before run starts, so a dispatch during processing is
    published and runs too."""
    first = jobs.until_processing.delay(3, seconds=1.5)
    assert jobs.until_processing.delay(3, seconds=1.5).deduplicated is True
    with thread_worker(app, pool="threads", concurrency=2):
        wait_for(lambda: jobs.runs("until_processing"))
        assert lock_of(jobs.until_processing, 3, seconds=1.5) is None
        second = jobs.until_processing.delay(3, seconds=1.5)
        assert second.deduplicated is False
        assert first.get(timeout=20) == 3
        assert second.get(timeout=20) == 3
    assert jobs.runs("until_processing") == ["3", "3"]


def test_until_processing_retry_is_published(app: Any, store_name: str) -> None:
    """P2: a retry is always published and re-takes the lock while it waits; it never
    releases a lock it does not own."""
    result = jobs.until_processing_retry.delay(9)
    with thread_worker(app):
        assert result.get(timeout=20) == 9
    assert jobs.runs("until_processing_retry") == ["(9, 0)", "(9, 1)"]
    assert lock_of(jobs.until_processing_retry, 9) is None


def test_worker_skips_message_whose_lock_is_held_by_another(app: Any, store_name: str) -> None:
    """W1/W3: a message whose key is locked by another owner does not run and ends REVOKED
    with a reason naming the holder."""
    holder = jobs.unique_sleep.delay(4, seconds=1.0)
    # No header: the worker computes the key ("4, 1.0" binds like item=4, seconds=1.0).
    stray = app.send_task("tests.unique_sleep", (4, 1.0))
    with thread_worker(app, pool="threads", concurrency=2):
        with pytest.raises(TaskRevokedError):
            stray.get(timeout=20)
        assert holder.get(timeout=20) == 4
    assert jobs.runs("unique_sleep") == ["4"]


def test_dispatch_with_countdown_keeps_its_lock_for_the_wait(app: Any, store_name: str) -> None:
    """U5: a dispatch that waits (countdown) keeps its lock for the wait plus unique_for, so
    the fail-safe expiry does not free the key while the message is still queued."""
    result = jobs.unique_sleep.apply_async((11,), countdown=500)
    lock = lock_of(jobs.unique_sleep, 11)
    assert lock is not None and lock.owner == result.id and lock.expires_at is not None
    assert lock.expires_at - lock.acquired_at == pytest.approx(560, abs=2)


def test_failing_signal_receiver_never_strands_a_lock(app: Any, store_name: str) -> None:
    """U6: a lock_acquired receiver that raises does not leave a lock with nothing queued:
    the dispatch is published and the error is logged."""
    from dedup_jobs.signals import lock_acquired

    def broken(**kwargs: Any) -> None:
        raise RuntimeError("metrics are down")

    lock_acquired.connect(broken, weak=False)
    try:
        result = jobs.unique_sleep.delay(12)
    finally:
        lock_acquired.disconnect(broken)
    assert result.deduplicated is False
    with thread_worker(app):
        assert result.get(timeout=20) == 12
    assert lock_of(jobs.unique_sleep, 12) is None


def test_retry_without_throw_hands_the_lock_to_the_retry(app: Any, store_name: str) -> None:
    """U4: self.retry(throw=False) followed by a return does not release the lock the retry
    now owns; a dispatch while the retry waits is deduplicated to it."""
    result = jobs.unique_retry_nothrow.delay(13)
    with thread_worker(app):
        wait_for(lambda: len(jobs.runs("unique_retry_nothrow")) == 1)
        # the first attempt has returned (its request left the worker); its retry waits 1 s
        wait_for(lambda: not any(r.id == result.id for r in worker_state.active_requests))
        during = jobs.unique_retry_nothrow.delay(13)
        assert during.deduplicated is True and during.id == result.id
        wait_for(lambda: len(jobs.runs("unique_retry_nothrow")) == 2)
        wait_for(lambda: lock_of(jobs.unique_retry_nothrow, 13) is None)
    assert jobs.runs("unique_retry_nothrow") == ["(13, 0)", "(13, 1)"]
