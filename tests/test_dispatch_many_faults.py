"""L3 against what a single dispatch promises, where a batch differs from a loop of them: the
red-team of ``dispatch_many`` (issue 26). On the real Redis store and broker: a failed publish
of an observed duplicate releases the later winners' locks (U6); a caller deduplicated onto
a winner that is never published gets an answer; with ON_STORE_ERROR="enqueue", the calls
the store answered before it failed keep their answers; an observed duplicate is published
over the batch's own producer (a pool of one never deadlocks)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from celery.app.task import Task
from celery.states import REVOKED
from django.conf import settings
from django.test import override_settings
from kombu.pools import ProducerPool

from dedup_jobs.exceptions import StoreUnavailable
from dedup_jobs.stores import get_store
from dedup_jobs.stores.base import BaseStore
from dedup_jobs.stores.redis.store import RedisStore
from tests import jobs

pytestmark = [pytest.mark.redis,
              pytest.mark.usefixtures("redis_store")]


@pytest.fixture
def redis_store() -> Any:
    with override_settings(DEDUP_JOBS={**settings.DEDUP_JOBS, "STORE": "redis"}):
        yield


def _owner(n: int) -> Any:
    return getattr(get_store("redis").get(jobs.unique_add.job_key((n,), {})), "owner", None)


def _refuse(monkeypatch: pytest.MonkeyPatch, at: int, before: Any = None) -> list[Any]:
    """The broker refuses the ``at``-th publish (0: the first); ``before`` runs just
    before that refusal. The ids published go into the list returned."""
    publish = Task.apply_async
    sent: list[Any] = []

    def flaky(self: Any, *args: Any, **kwargs: Any) -> Any:
        if len(sent) == at:
            sent.append("refused")
            if before is not None:
                before()
            raise ConnectionError("broker refused the message")
        result = publish(self, *args, **kwargs)
        sent.append(result.id)
        return result

    monkeypatch.setattr(Task, "apply_async", flaky)
    return sent


def test_a_refused_observed_duplicate_leaves_no_later_lock(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """R3 + U6: observe-only publishes the batch's duplicate too; the broker refuses it: the
    winners after it are released, nothing of theirs being queued."""
    jobs.unique_add.delay(90)
    monkeypatch.setattr(jobs.unique_add, "observe_only", True)
    _refuse(monkeypatch, at=0)
    with pytest.raises(ConnectionError, match="broker refused"):
        jobs.unique_add.dispatch_many([((90,), {}), ((91,), {}), ((92,), {})])
    assert (_owner(91), _owner(92)) == (None, None)


def test_a_caller_deduplicated_onto_an_unpublished_winner_gets_an_answer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """While the batch publishes its first winner, another client dispatches the second's
    key (deduplicated onto it); the broker refuses the first: the second is released and
    never published, and that client's result ends REVOKED instead of PENDING forever."""
    other: list[Any] = []
    _refuse(monkeypatch, at=0, before=lambda: other.append(jobs.unique_add.apply_async((2,))))
    with pytest.raises(ConnectionError, match="broker refused"):
        jobs.unique_add.dispatch_many([((1,), {}), ((2,), {})])
    assert other[0].deduplicated and _owner(2) is None
    assert other[0].state == REVOKED


def test_enqueue_keeps_the_answers_the_store_gave_before_it_failed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """ON_STORE_ERROR="enqueue" on a store that decides a batch call by call (BaseStore's
    acquire_many): the third call finds the store down; the first, a duplicate, still
    returns the holder's result, the second its own; the third is published without a
    lock."""
    holder = jobs.unique_add.delay(95)
    real, seen = RedisStore.acquire, []

    def acquire(self: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(args[0])
        if len(seen) == 3:
            raise StoreUnavailable("redis", "connection lost mid-batch")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(RedisStore, "acquire_many", BaseStore.acquire_many)
    monkeypatch.setattr(RedisStore, "acquire", acquire)
    with override_settings(DEDUP_JOBS={**settings.DEDUP_JOBS, "STORE": "redis",
                                       "ON_STORE_ERROR": "enqueue"}):
        results = jobs.unique_add.dispatch_many([((95,), {}), ((96,), {}), ((97,), {})])
    assert [(r.id == holder.id, r.deduplicated) for r in results] == [
        (True, True), (False, False), (False, False)]
    assert _owner(96) == results[1].id and _owner(97) is None


def test_an_observed_duplicate_goes_out_on_the_batchs_producer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A producer pool of one (broker_pool_limit=1): the batch holds its producer while it
    publishes, so an observed duplicate must be published on that one, not wait for
    another forever."""
    app = jobs.unique_add.app
    monkeypatch.setattr(app.amqp, "_producer_pool", ProducerPool(app.pool, limit=1))
    monkeypatch.setattr(jobs.unique_add, "observe_only", True)
    out: list[Any] = []
    batch = threading.Thread(target=lambda: out.append(
        jobs.unique_add.dispatch_many([((71,), {}), ((71,), {})])), daemon=True)
    batch.start()
    batch.join(10)
    assert out, "dispatch_many did not return within 10 s"
    assert [r.deduplicated for r in out[0]] == [False, False]


def test_an_empty_batch_and_a_generator() -> None:
    assert jobs.unique_add.dispatch_many([]) == []
    assert [r.deduplicated for r in jobs.unique_add.dispatch_many(
        iter([((1,), {}), ((1,), {})]))] == [False, True]
