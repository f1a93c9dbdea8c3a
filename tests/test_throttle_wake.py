"""The wake (T2, issue 26 item 5): a run that ends sooner than its waiters' turns were planned
calls the waiter of the earliest turn in its release, and the worker holding that waiter's
message runs it at once, on a real prefork worker and the Redis store."""

from __future__ import annotations

import time
from ast import literal_eval
from typing import Any

import pytest
import redis
from celery.utils import uuid
from django.conf import settings
from django.test import override_settings

from dedup_jobs.jobs.wake import AGAIN, COMMAND
from dedup_jobs.stores import get_store
from dedup_jobs.stores.throttling import TURN_FACTOR, TURN_PAD, WAKE_AFTER, WAKE_STRETCH
from tests import jobs, jobs_throttle
from tests.test_throttle_worker import _env
from tests.throttle_support import scheduled
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
            # A runs 1 s, and on until B waits: under load B can be taken after a fixed run
            a = task.delay(tag=1, seconds=1.0, until="wake:a-may-end")
            wait_for(lambda: server.zcard(slots_key) == 1, timeout=30)  # A runs
            b = task.delay(tag=2)
            wait_for(lambda: server.zscore(wait_key, b.id) is not None, timeout=10)
            turn = float(server.zscore(wait_key, b.id) or 0) / 1000
            # a wake reaches a message the worker holds, not one still on its way to it
            wait_for(lambda: b.id in scheduled(app), timeout=10)
            jobs.runs_client().set("wake:a-may-end", 1)
            assert a.get(timeout=30) == 1 and b.get(timeout=30) == 2
        runs = _runs()
    a_end, (b_start, _b_end, b_deferred) = runs[1][1], runs[2]
    assert b_deferred, runs  # B waited for the slot (published again with a countdown)
    assert turn - a_end > 2 * WAKE_AFTER + 2, (turn, a_end)  # its turn was seconds away
    assert b_start - a_end < 1.0, (b_start - a_end, turn - a_end)
    assert b_start < turn - 1.0, (b_start, turn)


@pytest.mark.redis
def test_a_wake_that_overtakes_its_message_moves_it_when_it_comes(app: Any) -> None:
    """A waiter's deferred message is published just before a release wakes it: the wake
    can reach the worker before the message does (on its way from the deferring process).
    The worker answers "not held here" and remembers the wake for MISSED_FOR seconds; the
    message, when it comes, is moved to now. Without that it kept its planned turn: a
    stretched turn left the freed slot idle 9.9 s in a run of the test above with A ended
    right after B's deferral. Only a re-publish of the same try is moved: a retry of the run
    the waiter became (its headers copied, one more retry) keeps its countdown."""
    dedup, env = _env("redis")
    with override_settings(DEDUP_JOBS=dedup):
        task = jobs_throttle.one_at_once
        with process_worker(concurrency=2, env=env):
            task.delay(tag=0).get(timeout=60)  # the worker is up
            waiter = uuid()

            def wake_finds_nothing() -> None:
                replies = app.control.broadcast(COMMAND, arguments={"task_id": waiter},
                                                reply=True, timeout=5, limit=1)
                assert [answer for reply in replies for answer in reply.values()] == [
                    {"ok": "not held here"}], replies

            wake_finds_nothing()
            sent = time.time()
            # the deferred message, as DedupJob.publish_again sends it (its first try)
            result = task.apply_async(kwargs={"tag": 7}, task_id=waiter, countdown=30,
                                      headers={AGAIN: 0})
            assert result.get(timeout=20) == 7
            # the wake moved one message, not the next of the same id (the result is the
            # first's: the run records tell them apart)
            task.apply_async(kwargs={"tag": 8}, task_id=waiter, countdown=2,
                             headers={AGAIN: 0})
            wait_for(lambda: 8 in _runs(), timeout=20)
            # a retry of that run, reaching a worker that remembers a wake of its id
            wake_finds_nothing()
            retried = time.time()
            task.apply_async(kwargs={"tag": 9}, task_id=waiter, countdown=2, retries=1,
                             headers={AGAIN: 0})
            wait_for(lambda: 9 in _runs(), timeout=20)
        runs = _runs()
    assert runs[7][0] - sent < 10, (runs[7][0] - sent)  # moved: not at its 30 s countdown
    assert runs[8][0] - runs[7][1] >= 1.9, runs  # the second kept its 2 s countdown
    assert runs[9][0] - retried >= 1.9, (runs[9][0] - retried)  # the retry kept its own


def _admit(store: Any, key: Any, owner: str, *, wakes: bool = False) -> Any:
    return store.throttle_admit(key, owner, delivery=f"d-{owner}-{time.monotonic_ns()}",
                                concurrency=1, rate_limit=0, rate_period=1.0, lease=60,
                                wakes=wakes)


def _keys(avg_ms: int) -> tuple[Any, Any, Any]:
    """The Redis store, a fresh throttle key of concurrency 1, its physical hash and waiters,
    the key's average run set to ``avg_ms``."""
    store = get_store("redis")
    key = jobs_throttle.one_at_once.throttle_key((), {})
    server = redis.Redis.from_url(f"{settings.REDIS_URL}/9")
    physical = store._throttle_keys(key)
    server.delete(*physical[:6])
    server.hset(physical[0], "avg", avg_ms)
    return store, key, physical


@pytest.mark.redis
def test_a_release_calls_the_waiter_of_the_earliest_turn(app: Any) -> None:
    """THROTTLE_RELEASE with the wake: the waiter of the earliest turn (seconds away: the
    runs were planned at 4 s) is named and its turn moved to now, so it is admitted when it
    comes; a later waiter keeps its turn; the release re-sent (S7: its reply lost) answers as
    the first, freed, and calls nobody again; a plain release calls nobody."""
    store, key, physical = _keys(4000)
    server = redis.Redis.from_url(f"{settings.REDIS_URL}/9")
    assert _admit(store, key, "a").admitted
    assert not _admit(store, key, "b").admitted and not _admit(store, key, "c").admitted
    turns = {m.decode(): s for m, s in server.zrange(physical[2], 0, -1, withscores=True)}
    assert turns["b"] < turns["c"] and turns["b"] / 1000 - time.time() > 4, turns
    released = store.throttle_release_waking(key, "a", WAKE_AFTER)
    assert (bool(released), released.wake) == (True, "b")
    assert float(server.zscore(physical[2], "b") or 0) / 1000 <= time.time() + 0.05
    assert float(server.zscore(physical[2], "c") or 0) == turns["c"]
    again = store.throttle_release_waking(key, "a", WAKE_AFTER)
    assert (bool(again), again.wake) == (True, None)
    assert _admit(store, key, "b").admitted  # back at once: its turn is now
    assert store.throttle_release(key, "b") is True  # the plain release: a bool, no wake


@pytest.mark.redis
def test_a_turn_due_soon_calls_nobody(app: Any) -> None:
    """Runs of 30 ms: the waiter's turn is well within WAKE_AFTER: it comes by itself, no
    wake (a broker message) is spent on it."""
    store, key, _physical = _keys(30)
    assert _admit(store, key, "a").admitted and not _admit(store, key, "b").admitted
    released = store.throttle_release_waking(key, "a", WAKE_AFTER)
    assert (bool(released), released.wake) == (True, None)


@pytest.mark.parametrize(("avg_ms", "stretched"), [(1000, True), (30, False)])
@pytest.mark.redis
def test_a_woken_front_end_plans_long_turns_later(app: Any, avg_ms: int,
                                                  stretched: bool) -> None:
    """WAKE_STRETCH: where waiters are woken, a turn is planned twice as far (a turn planned
    too late costs nothing then), if that puts it more than WAKE_AFTER later; runs of 30 ms
    keep the plain plan (their wake would cost a message per run)."""
    waits = {}
    for wakes in (False, True):
        store, key, _physical = _keys(avg_ms)
        assert _admit(store, key, "a", wakes=wakes).admitted
        deferred = _admit(store, key, "b", wakes=wakes)
        assert not deferred.admitted
        waits[wakes] = deferred.until - time.time()
    step = (avg_ms * TURN_FACTOR + TURN_PAD * 1000) / 1000
    assert abs(waits[False] - step) < 0.1 + step / 10, waits  # the jitter: a tenth of a step
    expected = step * WAKE_STRETCH if stretched else step
    assert abs(waits[True] - expected) < 0.1 + step / 10, waits
