"""Dispatch-side rules of UniqueJob on every store: U1, U2, U6, S4."""

from __future__ import annotations

import logging
from typing import Any

import kombu
import pytest
from django.conf import settings
from django.test import override_settings
from kombu.exceptions import OperationalError

from dedup_jobs.exceptions import DuplicateJob, StoreUnavailable
from dedup_jobs.signals import lock_acquired, unique_job_skipped
from tests import jobs
from tests.workers import thread_worker

pytestmark = pytest.mark.redis  # the broker


class Recorder:
    def __init__(self, *signals: Any) -> None:
        self.calls: list[tuple[Any, dict[str, Any]]] = []
        self.signals = signals

    def __call__(self, signal: Any, sender: Any, **kwargs: Any) -> None:
        self.calls.append((sender, kwargs))

    def __enter__(self) -> Recorder:
        for signal in self.signals:
            signal.connect(self, weak=False)
        return self

    def __exit__(self, *exc: Any) -> None:
        for signal in self.signals:
            signal.disconnect(self)


def queued(app: Any) -> int:
    """Messages waiting in the test queue on the real Redis broker."""
    with app.connection_for_read() as conn:
        return int(conn.default_channel.client.llen(app.conf.task_default_queue))


def test_first_dispatch_takes_the_lock_and_publishes(app: Any, store_name: str) -> None:
    """U1: a dispatch while no lock is held takes it (owner = the new task id) and publishes."""
    with Recorder(lock_acquired) as acquired:
        result = jobs.unique_sleep.delay(1)
    assert result.deduplicated is False
    lock = jobs.unique_sleep.store().get(jobs.unique_sleep.job_key((1,), {}))
    assert lock is not None and lock.owner == result.id and lock.state == "queued"
    assert queued(app) == 1
    [(sender, kwargs)] = acquired.calls
    assert sender is type(jobs.unique_sleep._get_current_object())
    assert kwargs == {"key": lock.key, "owner": result.id, "store": settings.DEDUP_JOBS["STORE"],
                      "observed": False}  # R3: every signal carries observed


def test_duplicate_dispatch_publishes_nothing(app: Any, store_name: str) -> None:
    """U2: a dispatch while the lock is held publishes nothing, sends unique_job_skipped
    (stage "dispatch") and returns an AsyncResult of the holder with .deduplicated True,
    whose .get() waits for the copy that runs."""
    first = jobs.unique_sleep.delay(2)
    with Recorder(unique_job_skipped) as skipped:
        second = jobs.unique_sleep.delay(item=2)
    assert second.deduplicated is True
    assert second.id == first.id
    assert queued(app) == 1
    [(sender, kwargs)] = skipped.calls
    assert sender is type(jobs.unique_sleep._get_current_object())
    assert kwargs["holder_id"] == first.id and kwargs["stage"] == "dispatch"
    assert kwargs["task_id"] != first.id
    assert kwargs["key"] == jobs.unique_sleep.job_key((2,), {}).key
    with thread_worker(app):
        assert second.get(timeout=20) == 2
    assert jobs.runs("unique_sleep") == ["2"]


def test_on_duplicate_raise(app: Any, store_name: str) -> None:
    """U2: on_duplicate = "raise" raises DuplicateJob naming the holder; nothing published."""
    first = jobs.RecalculateInvoice().delay(10)
    with pytest.raises(DuplicateJob) as info:
        jobs.RecalculateInvoice().delay(10, note="again")
    assert info.value.holder_id == first.id
    assert first.id in str(info.value)
    assert queued(app) == 1


def test_publish_failure_releases_the_lock(app: Any, store_name: str) -> None:
    """U6: if publishing fails after the lock was taken, the lock is released and the error
    propagates: never a lock with nothing queued."""
    dead = kombu.Connection("redis://127.0.0.1:1/0", connect_timeout=0.2)
    with pytest.raises(OperationalError):
        jobs.unique_sleep.apply_async((3,), connection=dead, retry=False)
    assert jobs.unique_sleep.store().get(jobs.unique_sleep.job_key((3,), {})) is None
    assert jobs.unique_sleep.delay(3).deduplicated is False


def test_encode_failure_releases_the_lock(app: Any, store_name: str) -> None:
    """U6: an argument the serializer refuses (outside unique_on) releases the lock too."""
    with pytest.raises(Exception, match="not JSON serializable"):
        jobs.unique_add.delay(4, b=object())
    assert jobs.unique_add.store().get(jobs.unique_add.job_key((4,), {})) is None
    assert queued(app) == 0


DEAD_CACHES = {
    **settings.CACHES,
    "dead": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": "redis://127.0.0.1:1/0",
        "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 0.2, "SOCKET_TIMEOUT": 0.2},
    },
}


@override_settings(CACHES=DEAD_CACHES, DEDUP_JOBS={"STORE": "dead"})
def test_store_unavailable_raises_with_nothing_published(app: Any) -> None:
    """S4: store unreachable at dispatch → StoreUnavailable naming the store; nothing
    published, nothing locked."""
    with pytest.raises(StoreUnavailable, match="'dead' is unavailable"):
        jobs.unique_sleep.delay(5)
    assert queued(app) == 0


@override_settings(CACHES=DEAD_CACHES, DEDUP_JOBS={"STORE": "dead", "ON_STORE_ERROR": "enqueue"})
def test_store_unavailable_enqueue_publishes_with_a_warning(
    app: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """S4: ON_STORE_ERROR="enqueue" publishes without a lock and logs a warning."""
    with caplog.at_level(logging.WARNING, logger="dedup_jobs"):
        result = jobs.unique_sleep.delay(6)
    assert result.deduplicated is False
    assert queued(app) == 1
    assert any(
        "without a lock" in r.getMessage() and result.id in r.getMessage() for r in caplog.records
    )
