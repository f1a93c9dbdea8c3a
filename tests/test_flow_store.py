"""The flow-control decisions of the stores (R1 ``take_over``, R2 ``start_exclusive``) on every
store: the Redis family, locmem, memcached (its bounded, cas-guarded client), the database store
on SQLite, PostgreSQL and MariaDB; and, on the database store, expiry by the database server's
clock (S3), never the client's."""

from __future__ import annotations

import time

import pytest

from dedup_jobs import clock
from dedup_jobs.stores import get_store
from dedup_jobs.stores.base import BaseStore, running_key
from tests import jobs_flow
from tests.conftest import ALL_STORE_PARAMS, DATABASE_STORE_PARAMS, store_fixture
from tests.test_database_clock import HOUR, skew

store_name = store_fixture(ALL_STORE_PARAMS)


def _store(store_name: str) -> BaseStore:
    return get_store("database" if store_name.startswith("database") else store_name)


def test_take_over_on_every_store(store_name: str) -> None:
    """R1/S7: free → taken; held queued by another → passes, the replaced owner named (a
    re-send answers the same); held running → not taken, the holder named."""
    store, key = _store(store_name), jobs_flow.replace_latest.job_key((7,), {})
    first = store.take_over(key, "owner-a", 60, now=clock.now())
    assert (first.acquired, first.replaced) == (True, None)
    second = store.take_over(key, "owner-b", 60, now=clock.now())
    assert (second.acquired, second.replaced) == (True, "owner-a")
    again = store.take_over(key, "owner-b", 60, now=clock.now())
    assert (again.acquired, again.replaced) == (True, "owner-a")
    lock = store.get(key)
    assert lock is not None and (lock.owner, lock.state) == ("owner-b", "queued")
    assert store.start(key, "owner-b", 60, now=clock.now(), release=False).run
    third = store.take_over(key, "owner-c", 60, now=clock.now())
    assert (third.acquired, third.holder) == (False, "owner-b")


def test_take_over_of_an_expired_lock(store_name: str) -> None:
    """R1: a lock whose ttl ran out (even a running one) is free: taken, nobody replaced.
    (memcached counts whole seconds: its lock lives up to 2 s longer than asked.)"""
    store, key = _store(store_name), jobs_flow.replace_latest.job_key((8,), {})
    assert store.start(key, "owner-a", 1, now=clock.now(), release=False).run
    time.sleep(3.2 if store_name == "memcached" else 1.3)
    answer = store.take_over(key, "owner-b", 60, now=clock.now())
    assert (answer.acquired, answer.holder, answer.replaced) == (True, "owner-b", None)


def test_start_exclusive_on_every_store(store_name: str) -> None:
    """R2/W5/S7: the holder of the lock starts (its lock released, the marker taken); a
    re-send of that start answers the same; another message of the key waits on the marker
    (overlap, its lock kept); another delivery of the running message is live; once the
    marker is released the next one starts."""
    store, key = _store(store_name), jobs_flow.no_overlap.job_key((9,), {})
    run = running_key(key)
    assert store.acquire(key, "one", 60, now=clock.now()).acquired
    first = store.start_exclusive(key, run, "one", 60, now=clock.now(), delivery="d-1")
    assert (first.run, first.took, first.released) == (True, True, True)
    assert store.get(key) is None
    again = store.start_exclusive(key, run, "one", 60, now=clock.now(), delivery="d-1")
    assert (again.run, again.overlap) == (True, False)
    live = store.start_exclusive(key, run, "one", 60, now=clock.now(), delivery="d-2")
    assert (live.run, live.live, live.holder) == (False, True, "one")
    assert store.acquire(key, "two", 60, now=clock.now()).acquired
    waiting = store.start_exclusive(key, run, "two", 60, now=clock.now(), delivery="d-3")
    assert (waiting.run, waiting.overlap, waiting.holder) == (False, True, "one")
    lock = store.get(key)
    assert lock is not None and lock.owner == "two"  # the waiting message keeps its lock
    other = store.start_exclusive(key, run, "three", 60, now=clock.now(), delivery="d-4")
    assert (other.run, other.holder, other.overlap) == (False, "two", False)
    assert store.release(run, "one")
    second = store.start_exclusive(key, run, "two", 60, now=clock.now(), delivery="d-3")
    assert (second.run, second.released) == (True, True)
    marker = store.get(run)
    assert marker is not None and (marker.owner, marker.state) == ("two", "running")


@pytest.mark.parametrize("store_name", DATABASE_STORE_PARAMS, indirect=True)
def test_flow_expiry_is_the_servers_clock(
    store_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """S3/R1/R2: with the client's clock an hour ahead (by it, every lock expired long ago) a
    running lock is not taken over and a running marker still keeps the next run out."""
    store, key = _store(store_name), jobs_flow.no_overlap.job_key((10,), {})
    run = running_key(key)
    other = jobs_flow.replace_latest.job_key((10,), {})
    assert store.start(other, "runner", 60, now=clock.now(), release=False).run
    assert store.start_exclusive(key, run, "one", 60, now=clock.now(), delivery="d-1").run
    skew(monkeypatch, HOUR)
    taken = store.take_over(other, "late", 60, now=clock.now())
    assert (taken.acquired, taken.holder) == (False, "runner")
    assert store.acquire(key, "two", 60, now=clock.now()).acquired
    waiting = store.start_exclusive(key, run, "two", 60, now=clock.now(), delivery="d-2")
    assert (waiting.run, waiting.overlap, waiting.holder) == (False, True, "one")


@pytest.mark.parametrize("store_name", DATABASE_STORE_PARAMS, indirect=True)
def test_flow_lock_lasts_its_ttl_by_the_servers_clock(
    store_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """S3/R1/R2: taken by a client two hours behind, a take-over's lock and a run's marker
    still expire their ttl later by the server's clock (not two hours later)."""
    store, key = _store(store_name), jobs_flow.no_overlap.job_key((11,), {})
    run = running_key(key)
    other = jobs_flow.replace_latest.job_key((11,), {})
    skew(monkeypatch, -2 * HOUR)
    assert store.take_over(other, "a", 0.5, now=clock.now()).acquired
    assert store.start(other, "a", 0.5, now=clock.now(), release=False).run
    assert store.start_exclusive(key, run, "one", 0.5, now=clock.now(), delivery="d-1").run
    time.sleep(0.9)
    assert store.take_over(other, "b", 60, now=clock.now()).acquired
    assert store.start_exclusive(key, run, "two", 60, now=clock.now(), delivery="d-2").run
