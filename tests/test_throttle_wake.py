"""The wake (T2, issue 26 item 5): a run that ends sooner than its waiters' turns were planned
calls the waiter of the earliest turn in its release, and the worker holding that waiter's
message runs it at once, on a real prefork worker and the Redis store."""

from __future__ import annotations

import time
from ast import literal_eval
from typing import Any

import pytest
import redis
from django.conf import settings
from django.test import override_settings

from dedup_jobs.stores import get_store
from dedup_jobs.stores.throttling import WAKE_AFTER
from tests import jobs, jobs_throttle
from tests.test_throttle_worker import _env
from tests.workers import process_worker, wait_for


def _runs() -> dict[int, tuple[float, float, bool]]:
    return {tag: (start, end, deferred) for tag, start, end, deferred
            in (literal_eval(value) for value in jobs.runs("one_at_once"))}


@pytest.mark.redis
def test_a_freed_slot_is_taken_by_its_waiter_at_once(app: Any) -> None:
    """concurrency=1, the plan expecting runs of 4 s (the key's average, set on the store):
    A runs 1 s, B is deferred to a turn about 5 s after A's start. When A ends, its release
    calls B and the worker holding B's message runs it: B starts within a second of A's end,
    seconds before its planned turn, with no further deferral (2 admissions for B: the first
    deferred it, the second, woken, admitted it). Without the wake B starts at its turn."""
    dedup, env = _env("redis")
    with override_settings(DEDUP_JOBS=dedup):
        task = jobs_throttle.one_at_once
        store = get_store("redis")
        key = task.throttle_key((), {})
        hash_key, slots_key, wait_key = store._throttle_keys(key)[:3]
        server = redis.Redis.from_url(f"{settings.REDIS_URL}/9")
        with process_worker(concurrency=4, env=env):
            task.delay(tag=0).get(timeout=60)  # the worker is up, the scripts loaded
            wait_for(lambda: store.throttle_admit(
                key, "probe", delivery=f"p{time.monotonic()}", concurrency=1, rate_limit=0,
                rate_period=1, lease=60).admitted, timeout=10)
            store.throttle_release(key, "probe")
            server.hset(hash_key, "avg", 4000)  # the runs are expected to take 4 s
            a = task.delay(tag=1, seconds=1.0)
            wait_for(lambda: server.zcard(slots_key) == 1, timeout=30)  # A runs
            b = task.delay(tag=2)
            wait_for(lambda: server.zscore(wait_key, b.id) is not None, timeout=10)
            turn = float(server.zscore(wait_key, b.id) or 0) / 1000
            assert a.get(timeout=30) == 1 and b.get(timeout=30) == 2
        runs = _runs()
    a_end, (b_start, _b_end, b_deferred) = runs[1][1], runs[2]
    assert b_deferred, runs  # B waited for the slot (published again with a countdown)
    assert turn - a_end > 2 * WAKE_AFTER + 2, (turn, a_end)  # its turn was seconds away
    assert b_start - a_end < 1.0, (b_start - a_end, turn - a_end)
    assert b_start < turn - 1.0, (b_start, turn)

