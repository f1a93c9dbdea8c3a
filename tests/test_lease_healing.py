"""W6: self-healing leases. A running job's lock that vanished (FLUSHDB, eviction, a release
under it) is taken back for the same owner by the next renewal, within LEASE_SECONDS / 3; one
that another owner took is left alone, with ``lock_lost`` sent and a WARNING logged. The lease
holds on the prefork, threads, solo, gevent and eventlet pools, also while the job's body never
yields. Store level: ``renew`` on every store. Workers: real Celery workers on the real Redis
broker, LEASE_SECONDS=3."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from typing import Any

import pytest
import redis
from django.conf import settings
from django.db import connections
from django.test import override_settings

from dedup_jobs import clock
from dedup_jobs.stores import get_store
from tests import jobs
from tests import jobs_guard as jg
from tests.guard_support import (
    BROKERS,
    QUEUE,
    publishing_to,
    reset_queue,
    token,
    worker_env,
    worker_logs,
)
from tests.workers import process_worker, thread_worker, wait_for

LEASE_SECONDS = 3.0
#: how late a renewal may be on this shared 2-core machine, beyond its LEASE_SECONDS / 3
SLACK = 1.5
POOLS = {"prefork": 1, "threads": 2, "solo": 1, "gevent": 2, "eventlet": 2}
WORKERS = [pytest.mark.redis, pytest.mark.worker]


# -- store level --------------------------------------------------------------------------


def test_renew_takes_a_free_key_back(store_name: str) -> None:
    """W6: renew of a key that is free (released under the job, flushed, evicted) takes the
    lock back for the same owner: running, with the JobKey's task name and readable id, the
    lease TTL, and listed with the held locks; renewing it again just extends it."""
    from dedup_jobs.stores.base import Renewed

    store = jobs.unique_sleep.store()
    key = jobs.unique_sleep.job_key((7,), {})
    now = clock.now()
    assert store.acquire(key, "a", 60, now=now).acquired
    assert store.release(key, "a")
    assert store.renew(key, "a", 30, now=now) == Renewed(held=True, retaken=True, holder=None)
    lock = store.get(key)
    assert lock is not None and lock.expires_at is not None
    assert (lock.owner, lock.state) == ("a", "running")
    assert (lock.task_name, lock.ident) == (key.task_name, key.ident)
    assert lock.expires_at == pytest.approx(now + 30, abs=2)
    if store.can_list:
        listed = [info for info in store.iter_locks() if info.ident == key.ident]
        assert [(info.owner, info.state) for info in listed] == [("a", "running")]
    assert store.renew(key, "a", 30, now=now) == Renewed(held=True, retaken=False, holder=None)


def test_renew_takes_an_expired_lock(store_name: str) -> None:
    """W6: an expired lock is a free key, whoever held it: renew takes it."""
    from dedup_jobs.stores.base import Renewed

    store = jobs.unique_sleep.store()
    key = jobs.unique_sleep.job_key((8,), {})
    assert store.acquire(key, "old", 0.2, now=clock.now()).acquired
    time.sleep(0.35)
    answer = store.renew(key, "a", 30, now=clock.now())
    assert answer == Renewed(held=True, retaken=True, holder=None)
    lock = store.get(key)
    assert lock is not None and (lock.owner, lock.state) == ("a", "running")


def test_renew_leaves_another_owners_lock_alone(store_name: str) -> None:
    """W6: renew that finds another owner reports it and changes nothing of its lock."""
    from dedup_jobs.stores.base import Renewed

    store = jobs.unique_sleep.store()
    key = jobs.unique_sleep.job_key((9,), {})
    now = clock.now()
    assert store.acquire(key, "b", 100, now=now).acquired
    before = store.get(key)
    answer = store.renew(key, "a", 500, now=now)
    assert answer == Renewed(held=False, retaken=False, holder="b")
    after = store.get(key)
    assert before is not None and after is not None and after.expires_at is not None
    assert (after.owner, after.state, after.acquired_at) == ("b", "queued", before.acquired_at)
    assert after.expires_at == pytest.approx(now + 100, abs=2)


def test_a_lock_taken_back_still_knows_its_delivery(store_name: str) -> None:
    """W6 with W5: the lock a lease took back is marked as run by the delivery that runs
    the job, so another delivery of the same message is told that run lives (it waits, W5)
    instead of running beside it."""
    from dedup_jobs.stores.base import Renewed

    store = jobs.unique_sleep.store()
    key = jobs.unique_sleep.job_key((12,), {})
    now = clock.now()
    assert store.start(key, "a", 30, now=now, release=False, delivery="first").run
    assert store.release(key, "a")
    answer = store.renew(key, "a", 30, now=now, delivery="first")
    assert answer == Renewed(held=True, retaken=True)
    second = store.start(key, "a", 30, now=now, release=False, delivery="second")
    assert (second.run, second.live) == (False, True)


def test_renew_of_a_free_key_is_atomic(store_name: str) -> None:
    """W6: 8 threads renewing one free key for 8 owners at once: exactly one takes it, the
    other seven see it held by that one."""
    store = jobs.unique_sleep.store()
    key = jobs.unique_sleep.job_key((10,), {})
    barrier = threading.Barrier(8)

    def renew(owner: str) -> Any:
        barrier.wait(timeout=30)
        try:
            return store.renew(key, owner, 30, now=clock.now())
        finally:
            connections.close_all()

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(renew, [f"o{i}" for i in range(8)]))
    winners = [f"o{i}" for i, answer in enumerate(answers) if answer.held]
    assert len(winners) == 1, answers
    assert all(a.holder == winners[0] for a in answers if not a.held), answers
    lock = store.get(key)
    assert lock is not None and lock.owner == winners[0]


DATABASES = [
    pytest.param("default", marks=pytest.mark.django_db(transaction=True), id="sqlite"),
    pytest.param("postgres", marks=pytest.mark.postgres, id="postgres"),
    pytest.param("mariadb", marks=pytest.mark.mariadb, id="mariadb"),
]


@pytest.mark.parametrize("database", DATABASES)
def test_database_renew_without_upsert(database: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """W6 on the database store's row-locking path (MySQL 8: row lock in a transaction),
    run here on SQLite, PostgreSQL and MariaDB (InnoDB, as MySQL): takes a free or expired
    key, extends its own lock without shortening it, and leaves another owner's alone."""
    from dedup_jobs.stores.base import Renewed
    from dedup_jobs.stores.database import statements

    with override_settings(DEDUP_JOBS={"STORE": "database", "DATABASE_ALIAS": database}):
        store = get_store("database")
        monkeypatch.setattr(statements, "dialect", lambda connection: None)
        key = jobs.unique_sleep.job_key((11,), {})
        now = clock.now()
        assert store.renew(key, "a", 30, now=now) == Renewed(held=True, retaken=True)
        assert store.renew(key, "a", 10, now=now) == Renewed(held=True)
        lock = store.get(key)
        assert lock is not None and lock.expires_at == pytest.approx(now + 30, abs=1)
        assert store.renew(key, "b", 30, now=now) == Renewed(held=False, holder="a")
        key = jobs.unique_sleep.job_key((13,), {})
        assert store.renew(key, "a", 0.3, now=now) == Renewed(held=True, retaken=True)
        time.sleep(0.5)  # a's lock expired (by the database server's clock): free for anyone
        assert store.renew(key, "b", 30, now=clock.now()) == Renewed(held=True, retaken=True)
        lock = store.get(key)
        assert lock is not None and (lock.owner, lock.state) == ("b", "running")


# -- a worker in this process: lock_lost ---------------------------------------------------


def take_over(store: Any, client: Any, key: Any, owner: str) -> Any:
    """Delete the lock at ``key`` and take the key for ``owner`` (again, if the running job's
    renewal happened to take it back in between); the lock as it now is."""
    for _ in range(3):
        client.delete(store.physical(key.key))
        if store.acquire(key, owner, 60, now=clock.now()).acquired:
            return store.get(key)
    raise AssertionError(f"{owner} could not take {key.key}")


@pytest.mark.redis
@pytest.mark.worker
def test_lock_taken_by_another_owner_sends_lock_lost(app: Any) -> None:
    """W6: while a job runs, its lock vanishes and another owner takes the key. The next
    renewal (within LEASE_SECONDS / 3) sends ``lock_lost(sender=<task class>, key, owner,
    store, holder, observed=False)`` and logs a WARNING; the body keeps running to its end,
    and the other owner's lock is never touched (not renewed, shortened or released)."""
    from dedup_jobs.signals import lock_lost

    received: list[dict[str, Any]] = []

    def receiver(**kwargs: Any) -> None:
        received.append(kwargs)

    class Records(logging.Handler):
        """Records of the dedup_jobs logger (the worker re-configures the root logger)."""

        def __init__(self) -> None:
            super().__init__(logging.WARNING)
            self.records: list[logging.LogRecord] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.records.append(record)

    records = Records()
    dedup_logger = logging.getLogger("dedup_jobs")
    dedup_logger.addHandler(records)
    lock_lost.connect(receiver)
    t = token()
    dedup = {**settings.DEDUP_JOBS, "STORE": "redis", "LEASE_SECONDS": LEASE_SECONDS}
    try:
        with (
            override_settings(DEDUP_JOBS=dedup),
            # the in-process worker's broker, also while this module's pool workers are up
            publishing_to(app, settings.CELERY_BROKER_URL),
            thread_worker(app, pool="threads", concurrency=2),
        ):
            result = jg.guard_gated.delay(t, 1, gate=t)
            wait_for(lambda: jg.runs(t))
            store = jg.guard_gated.store()
            key = jg.guard_gated.job_key((t, 1), {})
            before = take_over(store, redis.Redis.from_url(f"{settings.REDIS_URL}/9"), key,
                               "intruder")
            taken = time.monotonic()
            wait_for(lambda: received, timeout=LEASE_SECONDS / 3 + SLACK)
            print(f"W6 lock_lost {time.monotonic() - taken:.2f}s after the key changed hands")
            jg.open_gate(t)
            assert result.get(timeout=20) == 1
            after = store.get(key)
    finally:
        lock_lost.disconnect(receiver)
        dedup_logger.removeHandler(records)
    (kwargs,) = received
    assert kwargs["sender"] is type(app.tasks["tests.guard_gated"])
    assert {k: v for k, v in kwargs.items() if k not in ("signal", "sender")} == {
        "key": key.key, "owner": result.id, "store": "redis", "holder": "intruder",
        "observed": False,
    }
    warnings = [r for r in records.records if r.levelno == logging.WARNING and
                f"running task {result.id} is held by another owner" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in records.records]
    assert before is not None and after == before


# -- one subprocess worker per pool ----------------------------------------------------------


@pytest.fixture(scope="module")
def pool_queues() -> Iterator[dict[str, str]]:
    """A ``celery worker -P <pool>`` subprocess per pool, LEASE_SECONDS=3, each consuming a
    queue of its own on the Redis broker; the test app publishes there meanwhile."""
    from tests.celery_app import app
    from tests.conftest import need

    need("redis")
    url = BROKERS["redis"]
    queues = {pool: f"{QUEUE}-heal-{pool}" for pool in POOLS}
    env = {"DEDUP_JOBS_TEST_LEASE_SECONDS": str(LEASE_SECONDS)}
    with ExitStack() as stack:
        for pool, concurrency in POOLS.items():
            reset_queue(app, url, queues[pool])
            stack.enter_context(process_worker(
                pool=pool, concurrency=concurrency, env=worker_env(queues[pool], env), broker=url
            ))
        stack.enter_context(publishing_to(app, url))
        pings = {pool: jg.guard_ping.apply_async(queue=queue) for pool, queue in queues.items()}
        for pool, ping in pings.items():
            assert ping.get(timeout=90) == "pong", pool
        yield queues


def _pttl(client: Any, physical: str) -> int:
    return int(client.pttl(physical))


@pytest.mark.redis
@pytest.mark.worker
def test_every_pool_keeps_the_lock_of_a_body_that_never_yields(
    pool_queues: dict[str, str],
) -> None:
    """W6 pools: a body that never yields (a CPU loop of 2 x LEASE_SECONDS) on prefork,
    threads, solo, gevent and eventlet at once: its lock's PTTL never reaches 0 while it runs,
    dispatches meanwhile are deduplicated, each body runs once, and once it finished the lock
    is gone and stays gone (a renewal never takes back a finished job's lock)."""
    t = token()
    store = jg.guard_busy.store()
    client = redis.Redis.from_url(f"{settings.REDIS_URL}/9")
    names = {pool: f"{t}-{pool}" for pool in POOLS}
    physical = {pool: store.physical(jg.guard_busy.job_key((names[pool], 0.0), {}).key)  # type: ignore[attr-defined]
                for pool in POOLS}
    results = {pool: jg.guard_busy.apply_async((names[pool], 2 * LEASE_SECONDS), queue=queue)
               for pool, queue in pool_queues.items()}
    seen: dict[str, float] = {}  # when each body was first seen running (monotonic)

    def all_started() -> bool:
        for pool, name in names.items():
            if pool not in seen and jg.runs(name):
                seen[pool] = time.monotonic()
        return len(seen) == len(POOLS)

    wait_for(all_started, timeout=30, interval=0.02)
    lowest = {pool: 10**9 for pool in POOLS}
    duplicates = {pool: 0 for pool in POOLS}
    published = {pool: 0 for pool in POOLS}
    last_dispatch = time.monotonic()
    while True:
        running = [pool for pool in POOLS if "'done'" not in jg.runs(names[pool])]
        if not running:
            break
        for pool in running:
            left = _pttl(client, physical[pool])
            if left <= 0 and "'done'" in jg.runs(names[pool]):
                continue  # it finished (and released) between the two reads
            lowest[pool] = min(lowest[pool], left)
        if time.monotonic() - last_dispatch > 1.0:
            last_dispatch = time.monotonic()
            for pool in running:
                if time.monotonic() > seen[pool] + 2 * LEASE_SECONDS - 1.0:
                    # its body ends within the second: a dispatch may rightly find the lock
                    # released (seen in CI: solo, published once, lowest PTTL 1.9 s)
                    continue
                dup = jg.guard_busy.apply_async((names[pool], 0.0), queue=pool_queues[pool])
                duplicates[pool] += 1
                published[pool] += not dup.deduplicated
        time.sleep(0.05)
    for pool, result in results.items():
        assert result.get(timeout=20) == names[pool]
    print("W6 lowest PTTL (ms) while running:", lowest)
    assert published == {pool: 0 for pool in POOLS}, "dispatches published during the run"
    assert [pool for pool in POOLS if not 0 < lowest[pool] < 10**9] == [], lowest
    assert all(count >= 3 for count in duplicates.values()), duplicates
    time.sleep(LEASE_SECONDS / 3 + 0.5)
    for pool in POOLS:
        assert _pttl(client, physical[pool]) == -2, f"{pool}: a finished job's lock came back"
        assert jg.runs(names[pool]) == ["'start'", "'done'"], pool


@pytest.mark.redis
@pytest.mark.worker
def test_every_pool_takes_a_flushed_lock_back(pool_queues: dict[str, str]) -> None:
    """W6: FLUSHDB of the lock store while a job runs on each pool: within LEASE_SECONDS / 3
    (plus slack) every lock is back, same owner, state running; a dispatch after that is
    deduplicated. Then another owner takes each key: each worker logs the WARNING and leaves
    the other owner's lock as it is; every body runs once, to its end."""
    t = token()
    store = jg.guard_gated.store()
    client = redis.Redis.from_url(f"{settings.REDIS_URL}/9")
    keys = {pool: jg.guard_gated.job_key((f"{t}-{pool}", 1), {}) for pool in POOLS}
    results = {pool: jg.guard_gated.apply_async((f"{t}-{pool}", 1), {"gate": t}, queue=queue)
               for pool, queue in pool_queues.items()}
    wait_for(lambda: all(jg.runs(f"{t}-{pool}") for pool in POOLS), timeout=30)
    client.flushdb()
    flushed = time.monotonic()
    back: dict[str, float] = {}

    def all_back() -> bool:
        for pool in POOLS:
            info = store.get(keys[pool])
            if pool not in back and info is not None:
                assert (info.owner, info.state) == (results[pool].id, "running"), pool
                back[pool] = time.monotonic() - flushed
        return len(back) == len(POOLS)

    wait_for(all_back, timeout=LEASE_SECONDS / 3 + SLACK, interval=0.02)
    print("W6 lock back after FLUSHDB (s):", {pool: round(s, 2) for pool, s in back.items()})
    for pool in POOLS:
        dup = jg.guard_gated.apply_async((f"{t}-{pool}", 1), queue=pool_queues[pool])
        assert dup.deduplicated and dup.id == results[pool].id, pool

    before = {}
    for pool in POOLS:
        before[pool] = take_over(store, client, keys[pool], f"intruder-{pool}")

    def warned() -> bool:
        text = "".join(path.read_text(errors="replace") for path in worker_logs())
        lines = [line for line in text.splitlines() if "WARNING" in line]
        return all(any(f"running task {results[pool].id} is held by another owner" in line
                       for line in lines) for pool in POOLS)

    wait_for(warned, timeout=LEASE_SECONDS / 3 + SLACK)
    jg.open_gate(t)
    for pool in POOLS:
        assert results[pool].get(timeout=20) == 1
        assert store.get(keys[pool]) == before[pool], f"{pool}: the other owner's lock changed"
        assert jg.runs(f"{t}-{pool}") == ["1"], pool
