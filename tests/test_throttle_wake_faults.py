"""The throttle's wake under its red-team (T2, docs/throttling.md#wake). Every test but the
``test_holds_*`` ones failed on the wake as first committed (54ad1e4): each docstring names
the bug it found, fixed since. The ``test_holds_*`` tests are probes that found nothing,
kept as evidence."""

from __future__ import annotations

import time
from ast import literal_eval
from typing import Any

import pytest
import redis
from django.conf import settings
from django.test import override_settings

from dedup_jobs.stores import get_store
from tests import jobs, jobs_throttle, jobs_wake_redteam
from tests.test_throttle_worker import _env, most_at_once
from tests.throttle_support import scheduled
from tests.workers import process_worker, wait_for

EXTRA = ("-I", "tests.jobs_wake_redteam")


def _records(name: str) -> list[Any]:
    return [literal_eval(value) for value in jobs.runs(name)]


@pytest.mark.redis
def test_a_request_waiting_in_the_rate_limit_bucket_is_not_woken_twice(
        app: Any) -> None:
    """Was red at 54ad1e4 (bug):
    a task with ``concurrency=1`` and Celery's own ``rate_limit``. Its deferred
    message's ETA goes through the worker's ``limit_post_eta``: when the ETA fires the request
    waits in the task's token bucket, and stays in ``worker_state.scheduled_requests`` (only
    ``task_reserved`` removes it) with ``_eta_timer_entry`` the entry that has already fired
    (not canceled). A wake arriving then "moves" that fired entry: ``limit_post_eta`` is called
    a second time and the same request is added to the bucket twice, so the body runs twice.

    How the waiter's ETA fires before its turn: lease 3 s, so a wait for a slot is cut to
    LEASE/3 = 1 s, while the (stretched) turn is ~9.6 s away (the key's average run 4 s):
    B comes back before its turn, is deferred again... A ``rate_limit = "1/s"`` bucket kept
    busy by three messages of another account makes B wait in the bucket when A's release
    wakes it. B's body lasts 1.5 s, a token comes every second: the two runs of B overlap,
    two runs of the concurrency=1 key at once."""
    dedup, env = _env("redis", lease=3)
    with override_settings(DEDUP_JOBS=dedup):
        task = jobs_wake_redteam.rate_limited_one_at_once
        store = get_store("redis")
        key = task.throttle_key((1,), {})
        hash_key, slots_key, wait_key = store._throttle_keys(key)[:3]
        server = redis.Redis.from_url(f"{settings.REDIS_URL}/9")
        with process_worker(concurrency=4, env=env, extra=EXTRA):
            jobs_throttle.one_at_once.delay(tag=0).get(timeout=60)  # the worker is up
            server.hset(hash_key, "avg", 4000)  # the runs are expected to take 4 s
            a = task.delay(1, tag=1, seconds=3.5)
            wait_for(lambda: server.zcard(slots_key) == 1, timeout=30)  # A runs
            time.sleep(1.05)  # the bucket has a token again
            b = task.delay(1, tag=2, seconds=1.5)
            wait_for(lambda: server.zscore(wait_key, b.id) is not None, timeout=10)
            others = [task.delay(2, tag=10 + i) for i in range(3)]  # keep the bucket busy
            assert a.get(timeout=30) == 1 and b.get(timeout=30) == 2
            assert [o.get(timeout=30) for o in others] == [10, 11, 12]
            time.sleep(3.0)  # a second run of B, if any, comes a token later
        runs = _records("redteam_rl")
    b_runs = [r for r in runs if r[1] == 2]
    account_1 = [(start, end) for account, _tag, start, end, _pid in runs if account == 1]
    assert (len(b_runs), most_at_once(account_1)) == (1, 1), (
        f"B's body ran {len(b_runs)} times, {most_at_once(account_1)} runs of the "
        f"concurrency=1 key at once: {runs}")


@pytest.mark.redis
def test_remote_control_off_wakes_nobody(app: Any, monkeypatch: Any) -> None:
    """Was red at 54ad1e4 (bug):
    with ``worker_enable_remote_control = False`` the docs (throttling.md#wake,
    "Where it applies") and ``wakeable(app)`` say waiters are not woken (no stretch is
    planned), but ``ThrottledJob.__call__`` passes ``wake=self.waker()`` to ``holding``
    unconditionally: the release still moves the earliest waiter's turn to now on the store
    (a turn no worker will honour: nobody consumes the broadcast) and spends a broker message
    (``app.control.broadcast``) per such release."""
    from dedup_jobs.jobs.wake import wakeable

    monkeypatch.setitem(app.conf, "worker_enable_remote_control", False)
    monkeypatch.setattr(app, "_dedup_wakeable", None, raising=False)
    assert wakeable(app) is False
    broadcasts: list[Any] = []
    monkeypatch.setattr(app.control, "broadcast",
                        lambda *a, **kw: broadcasts.append((a, kw)))
    task = jobs_throttle.one_at_once
    store = get_store("redis")
    key = task.throttle_key((), {})
    hash_key, slots_key, wait_key = store._throttle_keys(key)[:3]
    server = redis.Redis.from_url(f"{settings.REDIS_URL}/9")
    server.hset(hash_key, "avg", 4000)

    import threading
    ran = threading.Thread(target=lambda: task.apply(kwargs={"tag": 1, "seconds": 1.0}))
    ran.start()
    wait_for(lambda: server.zcard(slots_key) == 1, timeout=10)
    waiter = store.throttle_admit(key, "the-waiter", delivery="d1", concurrency=1,
                                  rate_limit=0, rate_period=1.0, lease=60, wakes=False)
    assert not waiter.admitted
    turn = float(server.zscore(wait_key, "the-waiter") or 0) / 1000
    ran.join(timeout=30)
    after = float(server.zscore(wait_key, "the-waiter") or 0) / 1000
    assert broadcasts == [], f"a wake was broadcast with remote control off: {broadcasts}"
    assert after == turn, (f"the waiter's turn was moved by {turn - after:.2f}s with remote "
                           f"control off")


@pytest.mark.redis
def test_a_late_earliest_waiter_does_not_block_later_wakes(app: Any) -> None:
    """Was red at 54ad1e4 (regression of the stretch + "earliest turn only"):
    THROTTLE_RELEASE only looks at
    the waiter of the earliest turn (ZRANGE 0 0). Once that waiter is late (here: revoked
    while held, so its woken message never comes back; the same holds for a message lost
    with a SIGKILLed worker on the Redis broker, or one still queued behind a burst), every
    release finds it first, its turn in the past, and calls nobody, until it is purged a
    lease (60 s) after its turn, while the live waiters behind it, held by the worker, keep
    their turns stretched 2x on the promise that a release calls them.

    concurrency=1, the key's average run 2 s (a step 2.4 s, stretched 4.8 s). A runs 0.5 s;
    B and C are deferred (B ~4.8 s, C ~9.6 s after A's start); B is revoked. A's release
    calls B (the wake is spent on a message that never comes). N, a newcomer once B is late,
    takes the slot (the "missing" rule) and runs 0.5 s; its release calls nobody (B is the
    earliest, late); C, held by the worker, starts at its stretched turn, seconds after the
    slot was freed. Without the change (plain plan) C's turn was ~4.8 s after A's start."""
    dedup, env = _env("redis")
    with override_settings(DEDUP_JOBS=dedup):
        task = jobs_wake_redteam.one_at_once
        store = get_store("redis")
        key = task.throttle_key((), {})
        hash_key, slots_key, wait_key = store._throttle_keys(key)[:3]
        server = redis.Redis.from_url(f"{settings.REDIS_URL}/9")
        with process_worker(concurrency=4, env=env, extra=EXTRA):
            jobs_throttle.one_at_once.delay(tag=0).get(timeout=60)  # the worker is up
            server.hset(hash_key, "avg", 2000)
            # A runs until B and C are held (at least 0.5 s): a run of a fixed 0.5 s could
            # end before B was even taken under CI's load, and B then ran at once
            a = task.delay(tag=1, seconds=0.5, until="redteam:a-may-end")
            wait_for(lambda: server.zcard(slots_key) == 1, timeout=30)
            b = task.delay(tag=2)
            wait_for(lambda: server.zscore(wait_key, b.id) is not None, timeout=10)
            c = task.delay(tag=3)
            wait_for(lambda: server.zscore(wait_key, c.id) is not None, timeout=10)
            # B's and C's deferred messages are held by the worker (its timer)
            wait_for(lambda: {b.id, c.id} <= scheduled(app), timeout=10)
            app.control.revoke(b.id)
            jobs.runs_client().set("redteam:a-may-end", 1)
            assert a.get(timeout=30) == 1
            a_end = _records("redteam_one")[-1][2]
            # B, woken, never comes back: late once a step has passed
            time.sleep(max(0.0, a_end + 2.4 + 0.4 - time.time()))
            n = task.delay(tag=4, seconds=0.5)
            assert n.get(timeout=30) == 4
            assert c.get(timeout=30) == 3
        runs = {tag: (start, end) for tag, start, end in _records("redteam_one")}
    a_start, n_end, c_start = runs[1][0], runs[4][1], runs[3][0]
    assert c_start - n_end < 1.0, (
        f"C, a waiter held by the worker, started {c_start - n_end:.1f}s after N freed the "
        f"slot ({c_start - a_start:.1f}s after A's start; the plain plan had it ~4.8 s)")


try:
    from kombu.transport.memory import Transport as _MemoryTransport

    class SQSLikeTransport(_MemoryTransport):
        """A transport that implements what kombu's SQS transport declares
        (``kombu/transport/SQS``: asynchronous, a ``direct`` exchange only, no ``fanout``)."""

        implements = _MemoryTransport.implements.extend(
            asynchronous=True, exchange_type=frozenset(["direct"]))
except ImportError:  # pragma: no cover
    pass


@pytest.mark.parametrize("broker", [
    pytest.param({"broker_url": "memory://"}, id="memory-no-event-loop"),
    pytest.param({"broker_url": "filesystem://"}, id="filesystem-no-event-loop"),
    pytest.param({"broker_url": "memory://",
                  "broker_transport": "tests.test_throttle_wake_faults:SQSLikeTransport"},
                 id="sqs-like-no-fanout"),
])
def test_not_wakeable_where_no_wake_can_arrive(broker: dict[str, str]) -> None:
    """Was red at 54ad1e4 (bug):
    ``wakeable(app)`` (which makes THROTTLE_ADMIT plan every long turn 2x
    further, WAKE_STRETCH) checks only ``worker_enable_remote_control`` and the
    eventlet/gevent environment, not the broker. A worker runs an event loop only on a
    transport that ``implements.asynchronous`` (``Worker.should_use_eventloop``; otherwise
    its timer is a thread and ``dedup_jobs_wake`` answers "not on an event loop"), and has a
    remote control at all only on a transport with a ``fanout`` exchange
    (``celery.worker.consumer.control.Control.include_if``): on SQS (direct only), and on
    filesystem/memory/SQLAlchemy-like brokers (no event loop), no wake can ever arrive, yet
    every long turn is planned twice as far: a freed slot idles up to two steps instead of
    one (docs/throttling.md#wake "Where it applies": Redis or RabbitMQ)."""
    from celery import Celery

    from dedup_jobs.jobs.wake import wakeable

    other = Celery("redteam", set_as_current=False)
    other.conf.update(broker)
    with other.connection_for_write() as connection:
        event_loop = bool(connection.transport.implements.asynchronous)
        remote_control = bool(connection.supports_exchange_type("fanout"))
    assert wakeable(other) == (event_loop and remote_control), (
        f"wakeable() = {wakeable(other)} on {broker}: event loop {event_loop}, remote "
        f"control {remote_control}")


@pytest.mark.redis
def test_two_slots_freed_together_wake_two_waiters(app: Any) -> None:
    """Was red at 54ad1e4 (bug):
    concurrency=2, two runs end together (within the time a wake takes to bring
    its waiter back and have it admitted, tens of ms). The first release calls the waiter of
    the earliest turn and moves its turn to now; the second release looks at the earliest
    turn again (ZRANGE 0 0), finds that same waiter (not back yet: its turn is now, not more
    than WAKE_AFTER away) and calls nobody. The second waiter, held by the worker, keeps its
    turn, stretched 2x (~9.6 s after the runs' start for a 4 s average): the second slot
    idles for seconds although a waiter is held for it.

    Two runs A1, A2 ending at the same instant once B and C are held (concurrency=2, the
    key's average run set to 4 s), waiters B and C deferred: both should start within a
    second of A1/A2's end."""
    dedup, env = _env("redis")
    with override_settings(DEDUP_JOBS=dedup):
        task = jobs_wake_redteam.two_at_once_until
        store = get_store("redis")
        key = task.throttle_key((), {})
        hash_key, slots_key, wait_key = store._throttle_keys(key)[:3]
        server = redis.Redis.from_url(f"{settings.REDIS_URL}/9")
        with process_worker(concurrency=4, env=env, extra=EXTRA):
            jobs_throttle.one_at_once.delay(tag=0).get(timeout=60)  # the worker is up
            server.hset(hash_key, "avg", 4000)
            # the first runs end together once the waiters are held (a fixed end could come
            # before a loaded worker took the waiters, which then ran at once)
            firsts = [task.delay(tag=1, until="redteam:firsts-end"),
                      task.delay(tag=2, until="redteam:firsts-end")]
            wait_for(lambda: server.zcard(slots_key) == 2, timeout=30)
            # the waiters run 3 s (a release of theirs would call the other)
            waiters = [task.delay(tag=3, seconds=3.0), task.delay(tag=4, seconds=3.0)]
            wait_for(lambda: server.zcard(wait_key) == 2, timeout=10)
            wait_for(lambda: {w.id for w in waiters} <= scheduled(app), timeout=10)
            jobs.runs_client().set("redteam:firsts-end", 1)
            assert [r.get(timeout=30) for r in firsts + waiters] == [1, 2, 3, 4]
        runs = {tag: (start, end) for tag, start, end in _records("redteam_two")}
    freed = max(runs[1][1], runs[2][1])
    late = {tag: round(runs[tag][0] - freed, 2) for tag in (3, 4)}
    assert max(late.values()) < 1.0, (
        f"waiters started this long after both slots were freed: {late}; the first runs "
        f"ended {abs(runs[1][1] - runs[2][1]) * 1000:.0f} ms apart")


def _admit2(store: Any, key: Any, owner: str, concurrency: int) -> Any:
    return store.throttle_admit(key, owner, delivery=f"d-{owner}-{time.monotonic_ns()}",
                                concurrency=concurrency, rate_limit=0, rate_period=1.0,
                                lease=60, wakes=True)


@pytest.mark.redis
def test_store_a_second_release_calls_the_next_waiter_while_the_first_is_on_its_way(
        app: Any) -> None:
    """Was red at 54ad1e4 (bug, store level, deterministic; the worker-level twin is
    ``test_two_slots_freed_together_wake_two_waiters``): concurrency=2, two slots
    released one after the other before the first woken waiter is back: the second release
    calls nobody (THROTTLE_RELEASE looks at ZRANGE 0 0 only: the waiter it has just called,
    whose turn is now), though another waiter is planned seconds away."""
    from dedup_jobs.stores.throttling import WAKE_AFTER

    store = get_store("redis")
    key = jobs_throttle.one_at_once.throttle_key((), {})
    server = redis.Redis.from_url(f"{settings.REDIS_URL}/9")
    physical = store._throttle_keys(key)
    server.delete(*physical[:6])
    server.hset(physical[0], "avg", 4000)
    assert _admit2(store, key, "a1", 2).admitted and _admit2(store, key, "a2", 2).admitted
    assert not _admit2(store, key, "b", 2).admitted and not _admit2(store, key, "c", 2).admitted
    first = store.throttle_release_waking(key, "a1", WAKE_AFTER)
    second = store.throttle_release_waking(key, "a2", WAKE_AFTER)
    turns = {m.decode(): round(s / 1000 - time.time(), 1)
             for m, s in server.zrange(physical[2], 0, -1, withscores=True)}
    assert {first.wake, second.wake} == {"b", "c"}, (
        f"two slots freed, waiters called: {first.wake!r}, {second.wake!r}; turns from now: "
        f"{turns}")


@pytest.mark.redis
def test_store_a_late_earliest_waiter_does_not_block_the_wake(app: Any) -> None:
    """Was red at 54ad1e4 (bug, store level, deterministic; the worker-level twin is
    ``test_a_late_earliest_waiter_does_not_block_later_wakes``): the waiter of the
    earliest turn is late (its turn 3 s ago: called by an earlier release and never back —
    revoked, lost with a SIGKILLed worker, queued behind a burst). A release then calls
    nobody, though the next waiter's turn (stretched) is seconds away; this lasts until the
    late one is purged, a lease (LEASE_SECONDS) after its turn."""
    from dedup_jobs.stores.throttling import WAKE_AFTER

    store = get_store("redis")
    key = jobs_throttle.one_at_once.throttle_key((), {})
    server = redis.Redis.from_url(f"{settings.REDIS_URL}/9")
    physical = store._throttle_keys(key)
    server.delete(*physical[:6])
    server.hset(physical[0], "avg", 4000)
    assert _admit2(store, key, "a", 1).admitted
    assert not _admit2(store, key, "ghost", 1).admitted
    assert not _admit2(store, key, "c", 1).admitted
    server.zadd(physical[2], {"ghost": int((time.time() - 3) * 1000)})  # late by 3 s
    released = store.throttle_release_waking(key, "a", WAKE_AFTER)
    c_turn = float(server.zscore(physical[2], "c") or 0) / 1000 - time.time()
    assert released.wake == "c", (
        f"the release called {released.wake!r}; c, the next live waiter, keeps its turn "
        f"{c_turn:.1f}s away")


# -- probes that held (PASS): kept as evidence of what was tried -----------------------------


@pytest.mark.redis
@pytest.mark.matrix  # a probe that found nothing: the slow step keeps it
def test_holds_a_retry_keeps_its_slot_and_the_waiter_is_woken_once(app: Any) -> None:
    """HOLDS (passes): A retries with a countdown (keeps its slot, T2); B, deferred meanwhile,
    is not woken by the retry (no release) and runs once, after A's second attempt, soon
    after it; never two runs at once."""
    dedup, env = _env("redis")
    with override_settings(DEDUP_JOBS=dedup):
        task = jobs_wake_redteam.retrying_one_at_once
        store = get_store("redis")
        key = task.throttle_key((), {})
        hash_key, slots_key, wait_key = store._throttle_keys(key)[:3]
        server = redis.Redis.from_url(f"{settings.REDIS_URL}/9")
        with process_worker(concurrency=4, env=env, extra=EXTRA):
            jobs_throttle.one_at_once.delay(tag=0).get(timeout=60)
            server.hset(hash_key, "avg", 3000)
            a = task.delay(tag=1, seconds=0.3, retry_countdown=2.0)
            wait_for(lambda: server.zcard(slots_key) == 1, timeout=30)
            b = task.delay(tag=2, seconds=0.3)
            wait_for(lambda: server.zscore(wait_key, b.id) is not None, timeout=10)
            assert a.get(timeout=30) == 1 and b.get(timeout=30) == 2
            time.sleep(1.0)
        runs = _records("redteam_retry")
    assert sorted((tag, retries) for tag, retries, _s, _e in runs) == [(1, 0), (1, 1), (2, 0)]
    assert most_at_once([(s, e) for _t, _r, s, e in runs]) == 1, runs
    a_end = max(e for t, _r, _s, e in runs if t == 1)
    b_start = next(s for t, _r, s, _e in runs if t == 2)
    assert 0 <= b_start - a_end < 1.0, runs


@pytest.mark.redis
@pytest.mark.matrix  # a probe that found nothing: the slow step keeps it
def test_holds_a_drain_with_cut_countdowns_runs_each_once(app: Any) -> None:
    """HOLDS (passes): without Celery's rate_limit, wakes racing with ETAs that fire early
    (lease 3 s: a wait is cut to 1 s, the stretched turns are seconds away, so waiters keep
    coming back before their turns while releases wake them): 10 messages of 0.2-0.7 s on
    concurrency=1 each run exactly once, never two at once."""
    import random

    dedup, env = _env("redis", lease=3)
    with override_settings(DEDUP_JOBS=dedup):
        task = jobs_wake_redteam.one_at_once
        store = get_store("redis")
        key = task.throttle_key((), {})
        hash_key = store._throttle_keys(key)[0]
        server = redis.Redis.from_url(f"{settings.REDIS_URL}/9")
        with process_worker(concurrency=4, env=env, extra=EXTRA):
            jobs_throttle.one_at_once.delay(tag=0).get(timeout=60)
            server.hset(hash_key, "avg", 2000)
            results = [task.delay(tag=i, seconds=random.uniform(0.2, 0.7)) for i in range(10)]
            assert [r.get(timeout=90) for r in results] == list(range(10))
            time.sleep(1.5)
        runs = _records("redteam_one")
    assert sorted(tag for tag, _s, _e in runs) == list(range(10)), runs
    assert most_at_once([(s, e) for _t, s, e in runs]) == 1, runs
