"""U5: the lease thread's cost. A job that starts while the renewal thread already waits for a
renewal due sooner than the job's own does not wake the thread (a stream of short jobs wakes
it once per renewal, not once per job); a job whose lease is due sooner still wakes it, and
its lock is renewed. A LeaseKeeper of the test's own, on the real Redis store."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import override_settings

from dedup_jobs import clock
from dedup_jobs.engine.lease import LeaseKeeper
from dedup_jobs.stores import get_store
from tests import jobs
from tests.workers import wait_for

pytestmark = [pytest.mark.redis]


@pytest.fixture
def redis_store() -> Iterator[Any]:
    from django.conf import settings

    with override_settings(DEDUP_JOBS={**settings.DEDUP_JOBS, "STORE": "redis"}):
        yield get_store("redis")


class Counted(LeaseKeeper):
    """A LeaseKeeper counting its thread's passes (each wake-up is one)."""

    def __init__(self) -> None:
        self.ticks = 0
        super().__init__()

    def _tick(self) -> None:
        self.ticks += 1
        super()._tick()


def _hold(keeper: LeaseKeeper, store: Any, name: str, ttl: float) -> Any:
    key = jobs.unique_sleep.job_key((name,), {})
    store.acquire(key, name, ttl, now=clock.now())
    return key, keeper.hold(store, key, name, ttl, sender=type(jobs.unique_sleep))


def _wake_ups_for_jobs(keeper: Counted, store: Any, prefix: str, ttl: float) -> int:
    """How often the thread woke while 50 short jobs ran one after the other."""
    before = keeper.ticks
    for n in range(50):
        key, hold = _hold(keeper, store, f"{prefix}-{n}", ttl)
        with hold:
            pass
        store.release(key, f"{prefix}-{n}")
    return keeper.ticks - before


def test_short_jobs_do_not_wake_the_lease_thread_per_job(redis_store: Any) -> None:
    """U5: while the thread waits (for at most IDLE_WAIT) for a renewal due sooner than any
    new job's, 50 jobs start and end without waking it."""
    keeper = Counted()
    key, long_hold = _hold(keeper, redis_store, "wake-long", 60.0)  # renewal due in 20 s
    with long_hold:
        wait_for(lambda: keeper._wake_at > time.monotonic(), timeout=10)  # it waits now
        woke = _wake_ups_for_jobs(keeper, redis_store, "wake-short", 60.0)
    redis_store.release(key, "wake-long")
    assert woke <= 1, f"the lease thread woke {woke} times for 50 jobs"


def test_a_stream_of_short_jobs_alone_does_not_wake_the_lease_thread_per_job(
    redis_store: Any,
) -> None:
    """U5: with no other lease running (the thread idle between jobs, as in a worker of short
    tasks), 50 short jobs one after the other (3 s leases, renewals due in 1 s) wake the
    thread no more than a few times: it waits as long as a renewal interval when idle."""
    keeper = Counted()
    key, first = _hold(keeper, redis_store, "idle-first", 3.0)
    with first:
        pass
    redis_store.release(key, "idle-first")
    wait_for(lambda: keeper._wake_at > time.monotonic(), timeout=10)  # idle, waiting
    woke = _wake_ups_for_jobs(keeper, redis_store, "idle", 3.0)
    assert woke <= 3, f"the lease thread woke {woke} times for 50 jobs"


def test_a_lease_due_sooner_still_wakes_the_thread_and_is_renewed(redis_store: Any) -> None:
    """U5: a job whose renewal is due before the thread's planned wake-up wakes it: its lock
    (1.2 s lease, renewed every 0.4 s) outlives two lease lengths."""
    keeper = Counted()
    key, long_hold = _hold(keeper, redis_store, "due-long", 60.0)
    with long_hold:
        wait_for(lambda: keeper._wake_at > time.monotonic(), timeout=10)
        short_key, short_hold = _hold(keeper, redis_store, "due-short", 1.2)
        with short_hold:
            time.sleep(2.4)
            lock = redis_store.get(short_key)
        redis_store.release(short_key, "due-short")
    redis_store.release(key, "due-long")
    assert lock is not None and lock.owner == "due-short"


class Idle(LeaseKeeper):
    """A LeaseKeeper whose thread never renews anything (it only waits)."""

    def _tick(self) -> None:
        time.sleep(0.01)


def test_a_grant_from_a_re_sent_check_is_renewed_before_the_body_runs(redis_store: Any) -> None:
    """W4/W7 (issue 21 case 3): a deferred copy re-sends its check with the same nonce; the
    store answers as the first call did, without extending what that call took, which may
    have little life left. Its first renewal must land before the body runs, not race it on
    the lease thread: seen in CI, the running marker lapsed 0.1 s into the body and another
    run of the key started. The keeper's thread here renews nothing, so only a renewal made
    before the block starts can extend the lock."""
    key = jobs.unique_sleep.job_key(("resent",), {})
    redis_store.acquire(key, "resent", 0.5, now=clock.now())  # 500 ms of life left
    keeper = Idle()
    with keeper.hold(redis_store, key, "resent", 60, sender=type(jobs.unique_sleep),
                     renew_at_once=True):
        life = redis_store.get(key).expires_at - time.time()
    redis_store.release(key, "resent")
    assert life > 30, f"the lock had {life:.2f} s left when the body started"
