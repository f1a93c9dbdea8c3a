"""L3, bulk dispatch: ``Job.dispatch_many(calls)`` decides a unique kind's batch in one store
call (one round trip on the Redis family, counted on the server), publishes the winners, and
returns one ``AsyncResult`` per call, in order, as single dispatches would; bad input raises
before anything is dispatched; a publish that fails leaves no lock without its message."""

from __future__ import annotations

import contextlib
from typing import Any

import kombu
import pytest
from celery.app.task import Task
from django.conf import settings
from django.test import override_settings

from dedup_jobs import clock
from dedup_jobs.stores import get_store
from dedup_jobs.stores.base import AcquireCall, BaseStore
from tests import jobs, jobs_debounce
from tests.conftest import ALL_STORE_PARAMS, store_fixture
from tests.workers import thread_worker

store_name = store_fixture(ALL_STORE_PARAMS)


def _store(store_name: str) -> BaseStore:
    return get_store("database" if store_name.startswith("database") else store_name)


def test_acquire_many_answers_as_acquires_in_order_would(store_name: str) -> None:
    """Every store: a free key is taken, a key held by another owner names it, a key taken
    earlier in the same batch is a duplicate of that call; a re-sent batch (the same
    requests) answers the same (S7)."""
    store = _store(store_name)
    held, free, twice = (jobs.unique_sleep.job_key((n,), {}) for n in (71, 72, 73))
    assert store.acquire(held, "holder", 60, now=clock.now(), request="r-h").acquired
    calls = [AcquireCall(key=k, owner=o, ttl=60, request=o)
             for k, o in ((held, "a"), (free, "b"), (twice, "c"), (twice, "d"))]
    for _attempt in range(2):
        answers = store.acquire_many(calls, now=clock.now())
        assert [(a.acquired, a.holder) for a in answers] == [
            (False, "holder"), (True, "b"), (True, "c"), (False, "c")]
    assert [store.get(k).owner for k in (held, free, twice)] == ["holder", "b", "c"]  # type: ignore[union-attr]


def _queued() -> int:
    """Messages on the test queue of the suite's Redis broker."""
    import redis

    from tests.celery_app import app

    return int(redis.Redis.from_url(settings.CELERY_BROKER_URL).llen(
        app.conf.task_default_queue))


def _reads(client: Any) -> int:
    return int(client.info("stats")["total_reads_processed"])


def _fewest_reads(client: Any, batch: Any, tries: int = 3) -> tuple[int, list[Any]]:
    """The fewest reads the server made for ``batch(n)`` over ``tries`` tries (less the
    INFO that reads the count), and the answers of the last: another thread of this process
    (a lease, the rollback thread, a worker left from an earlier test) can only add reads,
    never take one away, so the fewest is the batch's own."""
    fewest, answers = None, []
    for n in range(tries):
        before = _reads(client)
        answers = list(batch(n))
        reads = _reads(client) - before - 1
        fewest = reads if fewest is None else min(fewest, reads)
    assert fewest is not None
    return fewest, answers


def _calls(tag: str, count: int = 19) -> list[AcquireCall]:
    return [AcquireCall(key=jobs.unique_sleep.job_key((f"{tag}-{n}",), {}), owner=f"{tag}{n}",
                        ttl=60, request=f"{tag}{n}") for n in range(count)]


@pytest.mark.redis
@override_settings(DEDUP_JOBS={"STORE": "redis"})
def test_a_batch_is_one_round_trip_on_redis(redis_client: Any) -> None:
    """Section 8 (L3), counted on the server: 19 decisions, 19 EVALSHAs, read by the server
    from its socket in one go (``total_reads_processed``)."""
    store = get_store("redis")
    store.acquire_many(_calls("warm", 1), now=clock.now())  # the connection and script warm
    reads, answers = _fewest_reads(redis_client, lambda n: store.acquire_many(
        _calls(f"r{n}"), now=clock.now()))
    assert [a.acquired for a in answers] == [True] * 19
    assert reads == 1, f"19 decisions took {reads} reads on the server"


@pytest.mark.redis
def test_a_batch_is_one_round_trip_through_sentinel(sentinel_store: Any) -> None:
    """The same through Redis Sentinel (S6), whose pool the store keeps no connections of:
    the client's pipeline, read by the primary in one go. (The replica's REPLCONF ACK, once
    a second, may be read in the same window: at most one more.)"""
    cache, setup = sentinel_store
    with override_settings(CACHES={**settings.CACHES, "sentinel": cache},
                           DEDUP_JOBS={**settings.DEDUP_JOBS, "STORE": "sentinel"}):
        store = get_store("sentinel")
        store.acquire_many(_calls("warm", 1), now=clock.now())  # the connection, the script
        reads, answers = _fewest_reads(setup.primary_server.client, lambda n: (
            store.acquire_many(_calls(f"s{n}"), now=clock.now())))
    assert [a.acquired for a in answers] == [True] * 19
    assert reads <= 2, f"19 decisions took {reads} reads on the primary"


@pytest.mark.redis
@override_settings(DEDUP_JOBS={"STORE": "redis"})
def test_dispatch_many_takes_a_batchs_locks_in_one_round_trip(redis_client: Any) -> None:
    """The job's batch, counted on the server: its messages go to an in-memory broker and
    no result is kept (the Redis result backend subscribes to each id it publishes), so
    what the Redis server reads is the store's: one read for the batch's 19 locks."""
    with kombu.Connection("memory://") as memory:
        jobs.unique_add.dispatch_many([((0,), {})], connection=memory,
                                      ignore_result=True)  # the connections and script warm
        reads, results = _fewest_reads(redis_client, lambda n: jobs.unique_add.dispatch_many(
            [((100 * (n + 1) + k,), {}) for k in range(19)], connection=memory,
            ignore_result=True))
    assert [r.deduplicated for r in results] == [False] * 19
    assert reads == 1, f"19 dispatches took {reads} reads on the store's server"


@pytest.mark.redis
def test_dispatch_many_returns_one_result_per_call_in_order(app: Any) -> None:
    """Winners are published and run once each; a call of a key held before, or taken by an
    earlier call of the batch, returns the holder's result, deduplicated."""
    holder = jobs.unique_add.delay(5)
    results = jobs.unique_add.dispatch_many([((1,), {}), ((2,), {"b": 1}), ((1,), {"b": 9}),
                                             ([5], None), ((3,), {})])
    assert [r.deduplicated for r in results] == [False, False, True, True, False]
    assert results[2].id == results[0].id and results[3].id == holder.id
    with thread_worker(app):
        assert [r.get(timeout=30) for r in results] == [1, 3, 1, 5, 3]
    assert sorted(jobs.runs("unique_add")) == ["(1, 0)", "(2, 1)", "(3, 0)", "(5, 0)"]


def test_bad_calls_raise_before_anything_is_dispatched(store_name: str) -> None:
    """A call that is not an (args, kwargs) pair, or an option that names one message,
    raises a TypeError naming it; no lock of the batch is left."""
    with pytest.raises(TypeError, match=r"call 1 is 7; each call is a pair \(args, kwargs\)"):
        jobs.unique_add.dispatch_many([((61,), {}), 7])
    with pytest.raises(TypeError, match="task_id name one message"):
        jobs.unique_add.dispatch_many([((62,), {})], task_id="mine")
    store = _store(store_name)
    assert store.get(jobs.unique_add.job_key((61,), {})) is None
    assert store.get(jobs.unique_add.job_key((62,), {})) is None


@pytest.mark.parametrize("broker", ["redis", "memory"])
def test_a_failed_publish_leaves_no_lock_without_its_message(
    store_name: str, broker: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """U6: the broker refuses the second winner, and the error is raised. On the Redis broker
    the batch is one publish batch, written at its end: nothing of it is queued, every
    winner's lock is released and its id marked REVOKED. On a broker that publishes at once
    (kombu's memory transport) the first winner stays queued with its lock, the second's
    and the third's are released. The same batch dispatched again publishes what was not."""
    publish = Task.apply_async
    sent: list[Any] = []

    def flaky(self: Any, *args: Any, **kwargs: Any) -> Any:
        if len(sent) == 1:
            sent.append("refused")
            raise ConnectionError("broker refused the message")
        result = publish(self, *args, **kwargs)
        sent.append(result.id)
        return result

    monkeypatch.setattr(Task, "apply_async", flaky)
    calls = [((n,), {}) for n in (81, 82, 83)]
    with contextlib.ExitStack() as stack:
        options = ({} if broker == "redis"
                   else {"connection": stack.enter_context(kombu.Connection("memory://"))})
        with pytest.raises(ConnectionError, match="broker refused"):
            jobs.unique_add.dispatch_many(calls, **options)
        store = _store(store_name)
        owners = [getattr(store.get(jobs.unique_add.job_key((n,), {})), "owner", None)
                  for n in (81, 82, 83)]
        queued = _queued()
        again = jobs.unique_add.dispatch_many(calls, **options)
    if broker == "redis":
        assert (owners, queued) == ([None, None, None], 0)
        assert jobs.unique_add.AsyncResult(sent[0]).state == "REVOKED"
        assert [r.deduplicated for r in again] == [False, False, False]
    else:
        assert owners == [sent[0], None, None]
        assert [r.deduplicated for r in again] == [True, False, False]
        assert again[0].id == sent[0]


@pytest.mark.redis
@override_settings(DEDUP_JOBS={"STORE": "redis"})
def test_a_batch_is_published_in_one_broker_round_trip(redis_client: Any) -> None:
    """L3 with the broker on the store's server: the batch's locks are one read on the
    server, its 5 messages one more (kombu's publish batch, one pipelined write), not one
    read each. (A batch whose messages pass 6,000 bytes is written by redis-py in pieces of
    that size, which the server may read one by one: still one round trip.)"""
    jobs.unique_add.dispatch_many([((0,), {})], ignore_result=True)  # connections, script
    reads, results = _fewest_reads(redis_client, lambda n: jobs.unique_add.dispatch_many(
        [((100 * (n + 1) + k,), {}) for k in range(5)], ignore_result=True))
    assert [r.deduplicated for r in results] == [False] * 5
    assert _queued() == 1 + 3 * 5
    assert reads == 2, f"5 dispatches took {reads} reads on the store's and broker's server"


@pytest.mark.redis
def test_other_kinds_dispatch_a_batch_call_by_call(app: Any) -> None:
    """A DebouncedJob's batch is its dispatches one by one: one burst, the last arguments."""
    results = jobs_debounce.debounce_record.dispatch_many(
        [((4,), {"value": v}) for v in (1, 2, 3)])
    assert len({r.id for r in results}) == 3
    with thread_worker(app):
        assert results[-1].get(timeout=30) == 3
    assert jobs_debounce.values("record") == [[4, 3]]
