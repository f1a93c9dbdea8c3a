"""S7 and S9 at dispatch (issue 21, cases 1, 5 and 9): a dispatch's store call whose reply is
lost (the proxy closes the connection: the client re-sends) or late (held past the client's
timeout: StoreUnavailable, then the undo of engine/rollback.py), and a store restarted under
kept connections. A private redis-server per test (tests/faults/servers.py), the proxy of
tests/faults/proxy.py, real workers: in-process where one process is enough, a prefork
subprocess where the case crosses processes. The store's client gives up after 0.5 s,
STORE_TIMEOUT 1 s, LEASE_SECONDS 3 (tests/faults/store.py)."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from celery.signals import after_task_publish
from django.conf import settings
from django.db import transaction
from django.test import override_settings

from dedup_jobs.engine.rollback import rollbacks
from dedup_jobs.exceptions import StoreUnavailable
from dedup_jobs.jobs import unique
from dedup_jobs.signals import unique_job_cancelled
from dedup_jobs.stores import get_store
from dedup_jobs.stores.redis import scripts
from dedup_jobs.stores.redis.scripts import SHA
from tests.faults.jobs import bodies, fault_replace, fault_unique
from tests.faults.jobs_dispatch import fault_cancel
from tests.faults.proxy import Proxy, redis_proxy
from tests.faults.servers import RedisServer
from tests.faults.store import LEASE_SECONDS, STORE_TIMEOUT, faulty_store, lock_of, until
from tests.guard_support import token
from tests.jobs_guard import guard_ping
from tests.workers import process_worker, thread_worker, wait_for

pytestmark = [pytest.mark.redis, pytest.mark.worker]

#: the client's socket timeout is 0.5 s: a reply held this long arrives after it gave up
LATE = 1.5


@pytest.fixture
def published() -> Iterator[list[str]]:
    """The ids of every message published from the test's own thread."""
    sent: list[str] = []
    me = threading.get_ident()

    def on_publish(sender: Any = None, headers: Any = None, **_: Any) -> None:
        if threading.get_ident() == me:
            sent.append(str((headers or {}).get("id")))

    after_task_publish.connect(on_publish, weak=False)
    yield sent
    after_task_publish.disconnect(on_publish)


def _ready(results: list[Any], timeout: float) -> bool:
    return until(lambda: all(r.ready() for r in results), timeout)[0]


def _values(t: str) -> list[Any]:
    return [b["value"] for b in bodies(t)]


@pytest.mark.parametrize("how", [
    "apply_async",
    pytest.param("apply_async_on_commit", marks=pytest.mark.django_db(transaction=True)),
])
def test_explicit_id_whose_acquire_reply_is_lost_is_published(
    app: Any, store_proxy: Proxy, published: list[str], how: str
) -> None:
    """S7 (issue 21, case 1): "apply_async(task_id=X); the reply is lost and the store
    re-sends: the call returns deduplicated=True onto its own id X, which was never
    published" — S7: a store call re-sent after a lost reply returns the same answer as the
    first, for a generated or an explicit task id, dispatched at once or on commit. The proxy
    loses the ACQUIRE reply after Redis ran it (and closes the connection); the client
    re-sends it."""
    with faulty_store(store_proxy.url()), thread_worker(app):
        assert fault_unique.delay(token(), 0).get(timeout=10) == 0  # scripts loaded
        t = token()
        x = f"explicit-{t}"
        lost = store_proxy.drop_next_reply(match=SHA["ACQUIRE"].encode())
        if how == "apply_async":
            first = fault_unique.apply_async((t, 1), task_id=x)
        else:
            with transaction.atomic():
                fault_unique.apply_async_on_commit((t, 1), task_id=x)
            first = fault_unique.AsyncResult(x)
            first.deduplicated = x not in published  # type: ignore[attr-defined]
        assert lost.wait(0), "the proxy saw no ACQUIRE"
        ran = _ready([first], 10)
        state = first.state
        gone = until(lambda: lock_of(fault_unique, t) is None, 5)[0]
        again = fault_unique.delay(t, 2)
        again_ran = _ready([again], 10)
    assert not first.deduplicated and first.id == x and x in published, (
        f"dispatch of {x} returned deduplicated={first.deduplicated} onto {first.id}; "
        f"published {published}; after 10 s its state is {state}, runs {_values(t)}"
    )
    assert ran and first.result == 1 and gone, (state, _values(t))
    assert not again.deduplicated and again_ran and again.result == 2, (again.id, again.state)
    assert _values(t) == [1, 2]


def test_failed_redispatch_of_an_explicit_id_leaves_the_published_lock(
    app: Any, store_proxy: Proxy
) -> None:
    """S7 (issue 21, case 1, its neighbour): the undo of a failed dispatch touches only what
    that very request did. X is published and queued; a second dispatch of the same
    explicit id X, whose ACQUIRE reply comes after the client gave up, raises
    StoreUnavailable; its undo must neither delete the lock of the published X nor mark X
    REVOKED: later dispatches are still deduplicated onto X, and X runs once."""
    with faulty_store(store_proxy.url()):
        with thread_worker(app):
            assert fault_unique.delay(token(), 0).get(timeout=10) == 0  # scripts loaded
        t = token()
        x = f"explicit-{t}"
        first = fault_unique.apply_async((t, 1), task_id=x)  # queued: no worker yet
        late = store_proxy.delay_next_reply(LATE, match=SHA["ACQUIRE"].encode())
        undos = rollbacks.pending()
        with pytest.raises(StoreUnavailable):
            fault_unique.apply_async((t, 2), task_id=x)
        assert late.wait(0)
        # its undo ran (it is tried as soon as the store answers)
        wait_for(lambda: rollbacks.pending() <= undos, timeout=LEASE_SECONDS + LATE + 2)
        held = lock_of(fault_unique, t)
        meta = first.backend.get_task_meta(x, cache=False)
        duplicate = fault_unique.delay(t, 3)
        with thread_worker(app):
            ran = _ready([first, duplicate], 10)
    assert held is not None and held.owner == x, (
        f"after the undo of the failed re-dispatch of {x}, the lock of the published {x} is "
        f"{held}; its result {meta['status']} {meta['result']!r}"
    )
    assert meta["status"] == "PENDING", meta
    assert duplicate.deduplicated and duplicate.id == x
    assert ran and first.state == "SUCCESS" and _values(t) == [1], (first.state, _values(t))


def test_lost_take_over_reply_lets_the_replaced_holder_run(
    app: Any, private_redis: RedisServer
) -> None:
    """R1, S7 (issue 21, case 5): "Lost TAKE_OVER reply (on_duplicate='replace') while a
    worker takes the queued holder A: B raises StoreUnavailable, the worker skips A as 'held
    by B' (an id never published), the undo removes B's lock: zero bodies ran, A ended
    REVOKED naming B" — R1/S7: when the take-over ends in StoreUnavailable, the queued holder
    it would have replaced still runs.

    The dispatching test process reaches the store through one proxy, the prefork worker
    (a subprocess) through another. B's TAKE_OVER runs; its reply is held past the client's
    timeout, and the dispatcher's proxy then forwards nothing (so B's undo waits) until the
    worker has checked A; then the store answers the dispatcher again."""
    t = token()
    for name in ("TAKE_OVER", "START", "RELEASE", "RENEW"):
        # loaded before: the first reply to a START is then its answer, not NOSCRIPT
        private_redis.client.script_load(getattr(scripts, name))
    with redis_proxy(private_redis.host, private_redis.port) as mine, redis_proxy(
        private_redis.host, private_redis.port
    ) as workers, faulty_store(mine.url()):
        first = fault_replace.delay(t, 1)  # A, queued: no worker yet

        def lose() -> None:
            mine.blackhole()  # B's undo cannot reach the store for now
            time.sleep(LATE)  # the reply comes after B gave up

        lost = mine.before_next_reply(lose, match=SHA["TAKE_OVER"].encode())
        with pytest.raises(StoreUnavailable):
            fault_replace.delay(t, 2)  # B
        assert lost.wait(5), "the proxy saw no TAKE_OVER"
        checked = workers.before_next_reply(lambda: None, match=SHA["START"].encode())
        env = {
            "DJANGO_SETTINGS_MODULE": "tests.faults.settings_dispatch",
            "DEDUP_JOBS_TEST_FAULTY_STORE": workers.url(),
            "DEDUP_JOBS_TEST_LEASE_SECONDS": str(LEASE_SECONDS),
        }
        with process_worker(concurrency=2, env=env):
            assert guard_ping.delay().get(timeout=60) == "pong"
            assert checked.wait(30), "the worker never checked A"
            mine.pass_through()  # the store answers B's undo again
            ran = _ready([first], 4 * (STORE_TIMEOUT + LEASE_SECONDS))
            state, result = first.state, first.result
            gone = until(lambda: lock_of(fault_replace, t) is None, 5)[0]
    assert ran and state == "SUCCESS" and _values(t) == [1], (
        f"the queued holder {first.id} ended {state} ({result!r}); bodies ran with "
        f"{_values(t)}"
    )
    assert gone, lock_of(fault_replace, t)


def test_a_lost_cancel_reply_cancels_once_and_runs_the_new_dispatch_after(
    app: Any, store_proxy: Proxy, published: list[str]
) -> None:
    """L2, S7: the reply of a cancel_running dispatch's store call (TAKE_OVER with the
    running marker) is lost after Redis ran it; the client re-sends it. The re-send answers
    as the first did: B is published once, the running A is cancelled once (one signal), A
    stops at a renewal and ends REVOKED naming B, and B runs after A, never beside it."""
    cancelled: list[tuple[str, str]] = []

    def on_cancelled(sender: Any = None, **kwargs: Any) -> None:
        cancelled.append((kwargs["cancelled_id"], kwargs["by_id"]))

    unique_job_cancelled.connect(on_cancelled, weak=False)
    try:
        with faulty_store(store_proxy.url()), thread_worker(app):
            t = token()
            first = fault_cancel.delay(t, 1, seconds=30)
            assert until(lambda: len(bodies(t)) == 1, 10)[0], "A never started"
            lost = store_proxy.drop_next_reply(match=SHA["TAKE_OVER"].encode())
            second = fault_cancel.delay(t, 2)
            assert lost.wait(0), "the proxy saw no TAKE_OVER"
            assert second.get(timeout=20) == 2
            state, result = first.state, first.result
    finally:
        unique_job_cancelled.disconnect(on_cancelled)
    assert not second.deduplicated and published.count(second.id) == 1, published
    assert cancelled == [(first.id, second.id)], cancelled
    assert state == "REVOKED" and second.id in str(result), (state, result)
    runs = bodies(t)
    assert [b["value"] for b in runs] == [1, 2], runs
    assert runs[0]["end"] is not None and runs[0]["end"] <= runs[1]["start"], runs


def test_an_undo_on_a_store_that_stays_down_holds_up_no_other(
    private_redis: RedisServer,
) -> None:
    """S7: a failed dispatch's entries are removed within LEASE_SECONDS of its store's
    return, also while the undo of a dispatch on another store (one that stays down) is
    pending before it: the undos are tried in turn, not the first one until it gives up."""
    caches = {
        **settings.CACHES,
        "down": FAMILIES["django-redis"]("redis://127.0.0.1:1/0"),
        "up": FAMILIES["django-redis"](private_redis.url()),
    }
    options = {**settings.DEDUP_JOBS, "STORE_TIMEOUT": STORE_TIMEOUT,
               "LEASE_SECONDS": LEASE_SECONDS}
    key = fault_unique.job_key((token(),), {})
    with override_settings(CACHES=caches, DEDUP_JOBS=options):
        down, up = get_store("down"), get_store("up")
        # the dispatch on the store that stays down failed first (its undo gives up after
        # the window below, so that it holds nothing up in later tests)
        unique.undo_lock(fault_unique, down, key, f"down-{token()}", LEASE_SECONDS + 2)
        lost = f"lost-{token()}"
        up.acquire(key, lost, 60, now=time.time())  # then one whose reply was lost
        unique.undo_lock(fault_unique, up, key, lost, 60)
        gone, took = until(lambda: up.get(key) is None, LEASE_SECONDS + 1)
    assert gone, f"the lock of the lost reply was still there after {took:.1f}s"


#: S1: the Redis-family backends of the store, at a URL
FAMILIES = {
    "django-redis": lambda url: {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": url,
        "OPTIONS": {"SOCKET_TIMEOUT": 0.5, "SOCKET_CONNECT_TIMEOUT": 0.5},
    },
    "django": lambda url: {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": url,
        "OPTIONS": {"socket_timeout": 0.5, "socket_connect_timeout": 0.5},
    },
    "django-valkey": lambda url: {
        "BACKEND": "django_valkey.cache.ValkeyCache",
        "LOCATION": url.replace("redis://", "valkey://", 1),
        "OPTIONS": {"SOCKET_TIMEOUT": 0.5, "SOCKET_CONNECT_TIMEOUT": 0.5},
    },
}
#: restarts per backend
RESTARTS = 3
#: connections the store keeps before each restart (at least)
KEPT = 4


def _restart(server: RedisServer) -> None:
    """Stop the server by its pid and start it again on the same port (no persistence: it
    comes back empty); return once a PING on a fresh connection is answered."""
    command = server.process.args
    server.stop()
    server.process = subprocess.Popen(command, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL)
    wait_for(server.answers, timeout=10)


def _keep_connections(store: Any) -> int:
    """Dispatch-sized store calls from 8 threads at once until the store keeps at least
    KEPT connections between decisions; returns how many it keeps."""
    def call(n: int, barrier: threading.Barrier) -> None:
        barrier.wait(5)
        store.release(fault_unique.job_key((f"warm-{n}",), {}), "nobody")

    for _round in range(50):
        barrier = threading.Barrier(8)
        threads = [threading.Thread(target=call, args=(n, barrier)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        if len(store._idle) >= KEPT:
            break
    return len(store._idle)


@pytest.mark.parametrize("backend", list(FAMILIES))
def test_first_dispatches_after_a_restart_succeed(
    private_redis: RedisServer, published: list[str], backend: str
) -> None:
    """S9 (issue 21, case 9): "after a Redis restart (PING already answering) the first 2 of 8
    dispatches raised 'Connection closed by server' in 3 of 3 trials: the one re-send picks
    another stale kept connection" — S9: after a store restart the first decision succeeds
    once the server answers: kept connections the restart closed are discarded together,
    and the re-send goes out on a fresh connection. On each Redis-family backend, 3 restarts
    of the store's own server, each under at least 4 kept connections; then 8 dispatches."""
    caches = {**settings.CACHES, "restarted": FAMILIES[backend](private_redis.url())}
    options = {**settings.DEDUP_JOBS, "STORE": "restarted", "STORE_TIMEOUT": STORE_TIMEOUT,
               "LEASE_SECONDS": LEASE_SECONDS}
    failed: list[str] = []
    with override_settings(CACHES=caches, DEDUP_JOBS=options):
        store = get_store("restarted")
        for trial in range(RESTARTS):
            kept = _keep_connections(store)
            assert kept >= KEPT, f"the store kept only {kept} connections"
            _restart(private_redis)
            errors = []
            for n in range(8):
                try:
                    fault_unique.delay(f"{token()}-{n}", n)
                except StoreUnavailable as exc:
                    errors.append(f"dispatch {n + 1}: {exc}")
            if errors:
                failed.append(f"restart {trial + 1} (under {kept} kept connections): "
                              + "; ".join(errors))
    assert not failed, f"{len(failed)} of {RESTARTS} restarts:\n" + "\n".join(failed)
    assert len(published) == 8 * RESTARTS
