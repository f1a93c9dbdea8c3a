"""Stores: one atomic round trip per decision (S1, S3), compare-and-delete (U4), S2."""

from __future__ import annotations

from typing import Any

import kombu
import pytest
import redis
from celery.utils import uuid
from django.db import connections
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from dedup_jobs import clock
from dedup_jobs.exceptions import StoreUnavailable
from dedup_jobs.jobs.base import HEADER
from dedup_jobs.stores import get_store
from dedup_jobs.stores.base import Renewed
from tests import jobs
from tests.conftest import ALL_STORE_PARAMS, DATABASE_STORE_PARAMS, store_fixture

#: the store-facing tests run on every store, the other Redis-protocol backends included
store_name = store_fixture(ALL_STORE_PARAMS)

MEMORY = "memory://"  # publish without touching Redis, so commandstats count only the store


def load_scripts(store: Any) -> None:
    """Run every lock script once (another test may have run SCRIPT FLUSH), so that
    measured calls are not charged the one-off SCRIPT LOAD of a first use."""
    key = jobs.unique_sleep.job_key(("warm-up",), {})
    store.acquire(key, "warm", 5, now=clock.now())
    store.renew(key, "warm", 5, now=clock.now())
    store.start(key, "warm", 5, now=clock.now(), release=False)
    store.start(key, "warm", 5, now=clock.now(), release=True)
    store.release(key, "warm")


def delta(client: Any, action: Any) -> dict[str, int]:
    """Commands the store's Redis database received from clients during ``action``, read with
    MONITOR: commands run inside Lua scripts (marked "lua"), other databases (the result
    backend, the tests' run records), a Sentinel's and a replica's connections are left out.
    What is left is the store's round trips."""
    db = client.connection_pool.connection_kwargs.get("db", 0)
    kwargs = client.connection_pool.connection_kwargs
    watcher = redis.Redis(host=kwargs.get("host", "127.0.0.1"), port=kwargs.get("port", 6379))
    counts: dict[str, int] = {}
    client.echo("warm")  # the marker's own connection is set up before we watch
    # connections that are not clients of ours: a Sentinel's own (PING, INFO, PUBLISH
    # __sentinel__:hello; by the names Sentinel gives them) and a replica's (flag S)
    not_ours = {str(c["addr"]).rsplit(":", 1)[-1] for c in watcher.client_list()
                 if str(c.get("name", "")).startswith("sentinel-")
                 or "S" in str(c.get("flags", ""))}
    with watcher.monitor() as monitor:
        action()
        marker = f"dedup-jobs-end-{uuid()}"
        client.echo(marker)
        for event in monitor.listen():
            if marker in event["command"]:
                break
            if event.get("client_type") == "lua" or int(event.get("db", -1)) != db:
                continue
            if str(event.get("client_port")) in not_ours:
                continue
            name = event["command"].split(" ", 1)[0].lower()
            counts[name] = counts.get(name, 0) + 1
    return counts


def test_redis_round_trips_per_decision(family_store: str, server_client: Any) -> None:
    """S1 / section 8: on every Redis-protocol backend (django-redis, Django's RedisCache,
    django-valkey on Valkey), a first dispatch, a duplicate, the worker start check and the
    finish release are one command (EVALSHA) each, counted on the server."""
    redis_client = server_client
    task = jobs.unique_sleep
    load_scripts(task.store())
    with kombu.Connection(MEMORY) as memory:

        first: list[Any] = []
        assert delta(
            redis_client, lambda: first.append(task.apply_async((1,), connection=memory))
        ) == {"evalsha": 1}
        assert first[0].deduplicated is False
        dup: list[Any] = []
        assert delta(
            redis_client, lambda: dup.append(task.apply_async((1,), connection=memory))
        ) == {"evalsha": 1}
        assert dup[0].deduplicated is True

    key = task.job_key((1,), {})
    header = {HEADER: key.as_header(family_store)}
    # Worker side: start check (1) + release on success (1), nothing else.
    assert delta(redis_client, lambda: task.apply((1,), task_id=first[0].id, headers=header)) == {
        "evalsha": 2
    }
    assert task.store().get(key) is None


def test_redis_until_processing_start_is_one_round_trip(
    family_store: str, server_client: Any
) -> None:
    """S1 / section 8: the until-processing worker check and its release are one command,
    on every Redis-protocol backend."""
    redis_client = server_client
    task = jobs.until_processing
    load_scripts(task.store())
    with kombu.Connection(MEMORY) as memory:
        result = task.apply_async((1,), connection=memory)
    header = {HEADER: task.job_key((1,), {}).as_header(family_store)}
    assert delta(redis_client, lambda: task.apply((1,), task_id=result.id, headers=header)) == {
        "evalsha": 1
    }
    assert task.store().get(task.job_key((1,), {})) is None


def test_redis_index_lists_held_locks_without_keys(family_store: str, server_client: Any) -> None:
    """S1: held locks are indexed and listed without KEYS; released ones leave the index (on
    every Redis-protocol backend)."""
    redis_client = server_client
    store = get_store(family_store)
    with kombu.Connection(MEMORY) as memory:
        results = [jobs.unique_sleep.apply_async((i,), connection=memory) for i in range(5)]
    listed = delta(redis_client, lambda: listed_locks.extend(store.iter_locks()))
    assert "keys" not in listed and "scan" not in listed
    assert sorted(lock.owner for lock in listed_locks) == sorted(r.id for r in results)
    store.release(jobs.unique_sleep.job_key((0,), {}), results[0].id)
    assert len(list(store.iter_locks())) == 4


listed_locks: list[Any] = []


@pytest.fixture(autouse=True)
def _reset_listed() -> None:
    listed_locks.clear()


@pytest.mark.postgres
@override_settings(DEDUP_JOBS={"STORE": "database", "DATABASE_ALIAS": "postgres"})
def test_postgres_acquire_is_one_statement() -> None:
    """S3 / section 8: the database store acquires in one statement on PostgreSQL, for a free
    lock and for a duplicate alike."""
    store = get_store("database")
    key = jobs.unique_sleep.job_key((1,), {})
    with CaptureQueriesContext(connections["postgres"]) as queries:
        first = store.acquire(key, "owner-1", 60, now=clock.now())
    assert first.acquired and len(queries) == 1
    assert "ON CONFLICT" in queries[0]["sql"]
    with CaptureQueriesContext(connections["postgres"]) as queries:
        second = store.acquire(key, "owner-2", 60, now=clock.now())
    assert not second.acquired and second.holder == "owner-1" and len(queries) == 1


def test_expired_lock_is_free_again(store_name: str) -> None:
    """U5/S3: a lock past its expiry is free for the next owner."""
    store = jobs.unique_sleep.store()
    key = jobs.unique_sleep.job_key((1,), {})
    now = clock.now()
    assert store.acquire(key, "a", 0.3, now=now).acquired
    assert not store.acquire(key, "b", 60, now=now).acquired
    import time

    # every store expires by its own clock (the database server's, S3); memcached in whole
    # seconds, never sooner than asked: 0.3 s lives ceil(0.3) + 1 = 1 to 2 s
    time.sleep(2.05 if store_name == "memcached" else 0.4)
    answer = store.acquire(key, "b", 60, now=clock.now())
    assert answer.acquired and answer.holder == "b"


def test_release_is_compare_and_delete(store_name: str) -> None:
    """U4: release deletes only the owner's lock, never by key alone."""
    store = jobs.unique_sleep.store()
    key = jobs.unique_sleep.job_key((1,), {})
    owner = uuid()
    assert store.acquire(key, owner, 60, now=clock.now()).acquired
    assert store.release(key, "someone-else") is False
    lock = store.get(key)
    assert lock is not None and lock.owner == owner
    assert store.release(key, owner) is True
    assert store.get(key) is None
    # S7: made again by its owner (the client's re-send, or the worker's after a lost reply),
    # a release answers as the first did, on every store; it never deletes a lock taken since
    assert store.release(key, owner) is True
    assert store.acquire(key, "b", 60, now=clock.now()).acquired
    store.release(key, owner)
    assert store.get(key).owner == "b"  # type: ignore[union-attr]


def test_renew_never_shortens_and_only_for_owner(store_name: str) -> None:
    """U5: renew extends the owner's lock, never shortens it, and ignores other owners."""
    store = jobs.unique_sleep.store()
    key = jobs.unique_sleep.job_key((1,), {})
    now = clock.now()
    store.acquire(key, "a", 100, now=now)
    assert store.renew(key, "b", 500, now=now) == Renewed(held=False, holder="a")
    assert store.renew(key, "a", 10, now=now) == Renewed(held=True)
    lock = store.get(key)
    assert lock is not None and lock.expires_at is not None
    assert lock.expires_at == pytest.approx(now + 100, abs=1)
    store.renew(key, "a", 500, now=now)
    lock = store.get(key)
    assert lock is not None and lock.expires_at == pytest.approx(now + 500, abs=1)


def test_reentrant_acquire_refreshes_only_for_the_owner(store_name: str) -> None:
    """U4: a retry re-acquires its own lock (re-entrant) but never another owner's."""
    store = jobs.unique_sleep.store()
    key = jobs.unique_sleep.job_key((1,), {})
    now = clock.now()
    assert store.acquire(key, "a", 60, now=now).acquired
    assert not store.acquire(key, "a", 60, now=now).acquired  # not re-entrant: held
    assert store.acquire(key, "a", 60, now=now, reentrant=True).acquired
    other = store.acquire(key, "b", 60, now=now, reentrant=True)
    assert not other.acquired and other.holder == "a"


def test_worker_start_decides_by_owner(store_name: str) -> None:
    """W1: the worker check runs the holder (or a free key, taking it) and skips others."""
    store = jobs.unique_sleep.store()
    key = jobs.unique_sleep.job_key((1,), {})
    now = clock.now()
    free = store.start(key, "a", 30, now=now, release=False, delivery="d1")
    assert free.run and free.took
    lock = store.get(key)
    assert lock is not None and lock.owner == "a" and lock.state == "running"
    other = store.start(key, "b", 30, now=now, release=False, delivery="d3")
    assert not other.run and other.holder == "a" and not other.live
    released = store.start(key, "a", 30, now=now, release=True, delivery="d4")
    assert released.run and released.released
    assert store.get(key) is None


def test_worker_start_holds_a_queued_lock(store_name: str) -> None:
    """W1: the dispatch's own message runs under its lock (held, not taken)."""
    store = jobs.unique_sleep.store()
    key = jobs.unique_sleep.job_key((1,), {})
    assert store.acquire(key, "a", 30, now=clock.now()).acquired
    held = store.start(key, "a", 30, now=clock.now(), release=False, delivery="d1")
    assert held.run and not held.took and not held.live


def test_worker_start_resent_answers_as_first(store_name: str) -> None:
    """S7: the same delivery's start sent again (a lost reply) answers as the first did."""
    store = jobs.unique_sleep.store()
    key = jobs.unique_sleep.job_key((1,), {})
    first = store.start(key, "a", 30, now=clock.now(), release=False, delivery="d1")
    again = store.start(key, "a", 30, now=clock.now(), release=False, delivery="d1")
    assert (again.run, again.took, again.live) == (first.run, first.took, first.live) == (
        True, True, False)


def test_second_delivery_of_a_running_message_is_live(store_name: str) -> None:
    """W5: another delivery of a message whose run lives does not run; the lock is kept."""
    store = jobs.unique_sleep.store()
    key = jobs.unique_sleep.job_key((1,), {})
    assert store.start(key, "a", 30, now=clock.now(), release=False, delivery="d1").run
    second = store.start(key, "a", 30, now=clock.now(), release=False, delivery="d2")
    assert not second.run and second.live and second.holder == "a"
    lock = store.get(key)
    assert lock is not None and lock.owner == "a" and lock.state == "running"
    # once the first run released, a delivery of the same id takes the free lock again
    assert store.release(key, "a")
    third = store.start(key, "a", 30, now=clock.now(), release=False, delivery="d2")
    assert third.run and third.took


def test_redelivered_copy_of_a_run_that_just_released_is_done(family_store: str) -> None:
    """W5: "a copy the broker marks as redelivered that arrives after the first run finished
    is dropped" — also in the moment between the run's release and Celery storing its result
    (the result backend cannot tell yet): the release's tombstone names the owner whose run
    ended, and START answers a redelivered copy of that owner ``done`` without taking the key.
    A fresh delivery of the id (not redelivered), and a copy of another owner, still run."""
    store = get_store(family_store)
    key = jobs.unique_sleep.job_key((1,), {})
    assert store.start(key, "a", 30, now=clock.now(), release=False, delivery="d1").run
    assert store.release(key, "a")
    copy = store.start(key, "a", 30, now=clock.now(), release=False, delivery="d2",
                       redelivered=True)
    assert copy.done and not copy.run, copy
    assert store.get(key) is None  # nothing taken by the dropped copy
    other = store.start(key, "b", 30, now=clock.now(), release=False, delivery="d3",
                        redelivered=True)
    assert other.run and other.took and not other.done, other
    assert store.release(key, "b")
    fresh = store.start(key, "a", 30, now=clock.now(), release=False, delivery="d4")
    assert fresh.run and fresh.took and not fresh.done, fresh


def test_redis_error_replies_are_store_unavailable(family_store: str, server_client: Any) -> None:
    """S1/S4/W4: an error reply (here WRONGTYPE; READONLY, OOM, NOPERM alike) is
    StoreUnavailable, not a raw redis-py or valkey-py exception."""
    redis_client = server_client
    store = get_store(family_store)
    key = jobs.unique_sleep.job_key((1,), {})
    redis_client.set(store.physical(key.key), "not a hash")
    with pytest.raises(StoreUnavailable, match="WRONGTYPE"):
        store.acquire(key, "a", 60, now=clock.now())


def test_redis_times_come_from_the_server_clock(
    family_store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """S1: a client whose clock is an hour off neither lengthens a lock nor hides it from
    the index (times come from the server's own TIME)."""
    import time

    store = get_store(family_store)
    monkeypatch.setattr(clock, "now", lambda: time.time() + 3600)
    key = jobs.unique_sleep.job_key((1,), {})
    assert store.acquire(key, "a", 60, now=clock.now()).acquired
    lock = store.get(key)
    assert lock is not None and lock.expires_at is not None
    assert lock.expires_at == pytest.approx(time.time() + 60, abs=5)
    monkeypatch.setattr(clock, "now", lambda: time.time() + 7200)
    store.acquire(jobs.unique_sleep.job_key((2,), {}), "b", 60, now=clock.now())
    assert {lock.owner for lock in store.iter_locks()} == {"a", "b"}


@pytest.mark.django_db(transaction=True)
@override_settings(DEDUP_JOBS={"STORE": "database"})
def test_database_release_is_one_delete_even_with_delete_receivers() -> None:
    """U4: release stays a single compare-and-delete statement when the project connects
    pre/post_delete receivers (which turn QuerySet.delete() into select-then-delete): one
    UPDATE that expires the owner's row, leaving it as the release's S7 tombstone."""
    from django.db.models.signals import pre_delete

    def receiver(**kwargs: Any) -> None:
        pass

    pre_delete.connect(receiver, weak=False)
    try:
        store = get_store("database")
        key = jobs.unique_sleep.job_key((1,), {})
        store.acquire(key, "a", 60, now=clock.now())
        with CaptureQueriesContext(connections["default"]) as queries:
            assert store.release(key, "b") is False
            assert store.release(key, "a") is True
        assert [q["sql"].split()[0] for q in queries] == ["UPDATE", "UPDATE"]
    finally:
        pre_delete.disconnect(receiver)


@pytest.mark.parametrize("store_name", DATABASE_STORE_PARAMS, indirect=True)
def test_database_store_without_time_zones(store_name: str) -> None:
    """S3: the database store works with USE_TZ = False (naive datetimes in TIME_ZONE, here
    America/Chicago: the server's UTC clock is shifted to it), on every database."""
    import time

    from dedup_jobs.keys import build_key
    from dedup_jobs.stores.base import encode_call

    with override_settings(USE_TZ=False):
        store = get_store("database")
        key = jobs.unique_sleep.job_key((1,), {})
        now = clock.now()
        assert store.acquire(key, "a", 0.5, now=now).acquired
        assert not store.acquire(key, "b", 60, now=now).acquired
        lock = store.get(key)
        assert lock is not None and lock.owner == "a"
        assert lock.expires_at == pytest.approx(time.time() + 0.5, abs=2)
        burst = build_key("debounce", "tests.no_tz", "item=1")
        assert store.debounce(burst, "m1", encode_call([1], {}), now=now, debounce_for=1.0,
                              max_wait=None, ttl=60.0).new
        state = store.get_debounce(burst)
        assert state is not None and state.runs_at == pytest.approx(now + 1.0, abs=0.01)
        time.sleep(0.7)
        assert store.acquire(key, "b", 60, now=clock.now()).acquired


def test_acquire_sent_twice_still_publishes(
    family_store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """U6: when the client re-sends an acquire whose reply was lost (redis-py retries on a
    connection error), the second answer says "held by you": the dispatch still publishes
    instead of leaving a lock with nothing queued."""
    from dedup_jobs.stores.redis import RedisStore

    real = RedisStore.acquire

    def acquire_twice(self: Any, key: Any, owner: str, ttl: float, **kwargs: Any) -> Any:
        real(self, key, owner, ttl, **kwargs)  # the first send: its reply "was lost"
        return real(self, key, owner, ttl, **kwargs)

    monkeypatch.setattr(RedisStore, "acquire", acquire_twice)
    with kombu.Connection(MEMORY) as memory:
        result = jobs.unique_sleep.apply_async((1,), connection=memory)
    assert result.deduplicated is False
    lock = jobs.unique_sleep.store().get(jobs.unique_sleep.job_key((1,), {}))
    assert lock is not None and lock.owner == result.id

