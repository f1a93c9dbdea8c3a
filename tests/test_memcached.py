"""The generic cache store on a real memcached (Django's ``PyMemcacheCache``), SPEC S2/S3:
compare-and-delete and renew guarded by memcached's ``cas`` (an owner whose lock expired and
was taken by another never deletes, renews or overwrites the new owner's lock), a memcached
that is down or stopped is StoreUnavailable within STORE_TIMEOUT (S4, S8, W4), and the cache
calls each decision costs. The store contract itself runs on memcached in
tests/test_stores.py and tests/test_debounce_store.py; contention in tests/test_concurrency.py.

The races are real interleavings on the real server: the store talks to memcached through
the fault proxy of tests/faults/proxy.py, which runs a competitor (through a second store
that talks to the server directly) right after the server answered the store's read and
before the store gets that answer."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from django.conf import settings
from django.core.cache import caches
from django.test import override_settings

from dedup_jobs import clock
from dedup_jobs.exceptions import StoreUnavailable
from dedup_jobs.keys import JobKey, build_key
from dedup_jobs.stores import get_store
from dedup_jobs.stores.base import BaseStore, Started, encode_call
from tests import jobs
from tests.faults.proxy import Proxy, redis_proxy
from tests.memcached_server import MemcachedServer, memcached_process
from tests.workers import thread_worker

STORE_TIMEOUT = 1.0
SLACK = 0.5  # scheduling and connection set-up on a loaded 2-core machine


@dataclass
class Pair:
    """``store`` talks to memcached through ``proxy``; ``direct`` to the server itself (the
    competitor); both on the same keys."""

    store: BaseStore
    direct: BaseStore
    proxy: Proxy

    def cache_key(self, name: str) -> bytes:
        return str(caches["mc-direct"].make_key(name)).encode()

    def between_read_and_write(self, name: str, competitor: Callable[[], None]) -> Any:
        """Run ``competitor`` right after the server answered the store's next read of
        ``name`` (``get`` or ``gets``), before the store gets that answer."""
        return self.proxy.before_next_reply(competitor, self.cache_key(name) + b"\r\n")


@pytest.fixture
def pair(memcached_server: MemcachedServer) -> Iterator[Pair]:
    memcached_server.flush()
    with redis_proxy(memcached_server.host, memcached_server.port) as proxy:
        proxied = memcached_server.cache(LOCATION=f"{proxy.host}:{proxy.port}")
        with override_settings(
            CACHES={**settings.CACHES, "mc": proxied, "mc-direct": memcached_server.cache()},
            DEDUP_JOBS={**settings.DEDUP_JOBS, "STORE": "mc"},
        ):
            yield Pair(get_store("mc"), get_store("mc-direct"), proxy)


KEY = jobs.unique_sleep.job_key((7,), {})


def expire_and_take(pair: Pair, owner: str = "b") -> Callable[[], None]:
    """The lock at KEY expires (it is gone from the server, as expiry makes it) and another
    dispatch takes it for ``owner``."""

    def competitor() -> None:
        caches["mc-direct"].delete(KEY.key)
        assert pair.direct.acquire(KEY, owner, 60, now=clock.now()).acquired

    return competitor


def held_by_b(pair: Pair) -> None:
    lock = pair.direct.get(KEY)
    assert lock is not None, "the new owner's lock was deleted by the former owner"
    assert (lock.owner, lock.state) == ("b", "queued"), f"the new owner's lock was changed: {lock}"
    assert lock.expires_at == pytest.approx(clock.now() + 60, abs=5)


def _race(pair: Pair, setup: Callable[[], Any], call: Callable[[], Any]) -> Any:
    setup()
    hook = pair.between_read_and_write(KEY.key, expire_and_take(pair))
    answer = call()
    assert hook.fired.is_set(), "the store never read the lock"
    assert hook.error is None, hook.error
    held_by_b(pair)
    return answer


def test_release_never_deletes_a_new_owners_lock(pair: Pair) -> None:
    """U4/S2: release is compare-and-delete by owner on memcached too: a's lock expires
    between release's read and its delete, and b takes the key; a's release answers False
    and b's lock stays (gets + cas to an already-expired item, never a plain delete)."""
    answer = _race(pair, lambda: pair.store.acquire(KEY, "a", 60, now=clock.now()),
                   lambda: pair.store.release(KEY, "a"))
    assert answer is False


def test_renew_never_renews_or_overwrites_a_new_owners_lock(pair: Pair) -> None:
    """U5/W6/S2: a's lease renewal reads its running lock, the lock expires and b takes the
    key before the write: the renewal reports b as holder and leaves b's lock as it is."""
    answer = _race(
        pair,
        lambda: pair.store.start(KEY, "a", 10, now=clock.now(), release=False, delivery="d"),
        lambda: pair.store.renew(KEY, "a", 60, now=clock.now(), delivery="d"),
    )
    assert (answer.held, answer.holder) == (False, "b")


def test_until_processing_release_never_deletes_a_new_owners_lock(pair: Pair) -> None:
    """P1/P2/S2: the until-processing worker check (start with release=True) reads a's lock,
    it expires and b takes the key: a's check does not delete b's lock; it finds b there and
    does not run (W1)."""
    answer = _race(pair, lambda: pair.store.acquire(KEY, "a", 60, now=clock.now()),
                   lambda: pair.store.start(KEY, "a", 30, now=clock.now(), release=True))
    assert answer == Started(run=False, holder="b")


def test_worker_start_never_overwrites_a_new_owners_lock(pair: Pair) -> None:
    """W1/S2: the worker check of a's message reads a's queued lock, it expires and b takes
    the key before the check marks it running: b's lock stays and a's message does not
    run."""
    answer = _race(pair, lambda: pair.store.acquire(KEY, "a", 60, now=clock.now()),
                   lambda: pair.store.start(KEY, "a", 30, now=clock.now(), release=False,
                                            delivery="d"))
    assert (answer.run, answer.holder) == (False, "b")


def test_reentrant_acquire_never_overwrites_a_new_owners_lock(pair: Pair) -> None:
    """U4/S2: a retry's re-entrant acquire reads its own lock, it expires and b takes the
    key before the refresh: b's lock stays and the retry is told b holds it."""
    answer = _race(pair, lambda: pair.store.acquire(KEY, "a", 60, now=clock.now()),
                   lambda: pair.store.acquire(KEY, "a", 60, now=clock.now(), reentrant=True))
    assert (answer.acquired, answer.holder) == (False, "b")


def test_debounce_mutex_release_never_frees_anothers_mutex(pair: Pair) -> None:
    """D1/S2: a debounce dispatch's mutex expires before it lets go and another dispatcher
    takes it: letting go leaves the other's mutex in place (so a third cannot enter beside
    the second)."""
    key = build_key("debounce", "tests.store_debounce", "item=1")
    mutex = f"{key.key}:mutex"

    def competitor() -> None:
        caches["mc-direct"].delete(mutex)
        assert caches["mc-direct"].add(mutex, "other", 30)

    hook = pair.between_read_and_write(mutex, competitor)
    pair.store.debounce(key, "t1", encode_call([1], {}), now=clock.now(), debounce_for=2.0,
                        max_wait=None, ttl=60.0)
    assert hook.fired.is_set() and hook.error is None, hook.error
    assert caches["mc-direct"].get(mutex) == "other", "another dispatcher's mutex was freed"


# -- cache calls per decision ---------------------------------------------------------------


def test_cache_calls_per_decision(pair: Pair) -> None:
    """S2: what each decision costs on memcached, counted on the wire (requests through the
    proxy): acquire 1 (add), a duplicate 2 (add + gets), worker start 2 (gets + cas),
    release 3 (gets + cas + the S7 tombstone's set), renew 2 (gets + cas), a debounce
    dispatch 5 (mutex add, get_many of the state and the dispatch's S7 answer, set_many,
    mutex gets + cas)."""
    store, now = pair.store, clock.now()
    key = build_key("debounce", "tests.store_debounce", "item=2")

    def count(action: Callable[[], Any]) -> int:
        before = pair.proxy.requests
        action()
        return pair.proxy.requests - before

    store.get(KEY)  # connected
    figures = {
        "acquire": count(lambda: store.acquire(KEY, "a", 60, now=now)),
        "duplicate": count(lambda: store.acquire(KEY, "b", 60, now=now)),
        "start": count(lambda: store.start(KEY, "a", 30, now=now, release=False,
                                           delivery="d")),
        "renew": count(lambda: store.renew(KEY, "a", 60, now=now, delivery="d")),
        "release": count(lambda: store.release(KEY, "a")),
        "debounce": count(lambda: store.debounce(key, "t1", encode_call([1], {}), now=now,
                                                 debounce_for=2.0, max_wait=None, ttl=60.0)),
    }
    print(f"S2 memcached cache calls per decision: {figures}")
    assert figures == {"acquire": 1, "duplicate": 2, "start": 2, "renew": 2, "release": 3,
                       "debounce": 5}


# -- a memcached that is down or stopped -----------------------------------------------------


@pytest.fixture
def private_memcached() -> Iterator[MemcachedServer]:
    with memcached_process() as server:
        yield server


def _settings(server: MemcachedServer, **dedup: Any) -> Any:
    return override_settings(
        CACHES={**settings.CACHES, "mc": server.cache()},
        DEDUP_JOBS={**settings.DEDUP_JOBS, "STORE": "mc", "STORE_TIMEOUT": STORE_TIMEOUT,
                    **dedup},
    )


def queued(app: Any) -> int:
    with app.connection_for_read() as conn:
        return int(conn.default_channel.client.llen(app.conf.task_default_queue))


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.mark.redis  # the broker
def test_memcached_down_is_store_unavailable(
    app: Any, private_memcached: MemcachedServer, caplog: pytest.LogCaptureFixture
) -> None:
    """S4/W4/S2: memcached stopped (by its pid): a dispatch raises StoreUnavailable naming
    the store with nothing published, again and again (no silent "free" answer from the
    client's retry bookkeeping); with ON_STORE_ERROR="enqueue" it publishes with a WARNING,
    and the worker runs the job with a WARNING naming the task and its id."""
    with _settings(private_memcached):
        assert jobs.unique_sleep.delay(1).deduplicated is False  # connected and working
        private_memcached.stop()
        for _ in range(3):
            started = time.monotonic()
            with pytest.raises(StoreUnavailable, match="'mc' is unavailable"):
                jobs.unique_sleep.delay(2)
            assert time.monotonic() - started < STORE_TIMEOUT + SLACK
        assert queued(app) == 1
    with _settings(private_memcached, ON_STORE_ERROR="enqueue"):
        with caplog.at_level(logging.WARNING, logger="dedup_jobs"):
            result = jobs.unique_sleep.delay(3)
        assert result.deduplicated is False and queued(app) == 2
        seen = Records()
        logging.getLogger("dedup_jobs").addHandler(seen)  # the worker sets up its own logging
        try:
            with thread_worker(app):
                assert result.get(timeout=20) == 3
        finally:
            logging.getLogger("dedup_jobs").removeHandler(seen)
        warned = [r for r in seen.records
                  if r.levelno == logging.WARNING and "unavailable at the worker" in r.getMessage()
                  and result.id in r.getMessage()]
        assert warned, [r.getMessage() for r in seen.records]


def _pause(server: MemcachedServer) -> Any:
    import os
    import signal

    os.kill(server.pid, signal.SIGSTOP)
    # The signal is delivered asynchronously: a server busy on the other core may still answer
    # the next call (seen once in CI: DID NOT RAISE). Go on once the kernel says it is stopped.
    deadline = time.monotonic() + 5.0
    while _state(server.pid) not in ("T", "t") and time.monotonic() < deadline:
        time.sleep(0.005)
    assert _state(server.pid) in ("T", "t"), "memcached did not stop"
    return lambda: os.kill(server.pid, signal.SIGCONT)


def _state(pid: int) -> str:
    """The process state letter of /proc/<pid>/stat (T: stopped by a signal)."""
    from pathlib import Path

    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]


CALLS: dict[str, Callable[[BaseStore, JobKey], Any]] = {
    "acquire": lambda store, key: store.acquire(key, "a", 30, now=clock.now()),
    "start": lambda store, key: store.start(key, "a", 30, now=clock.now(), release=False,
                                            delivery="d1"),
    "release": lambda store, key: store.release(key, "a"),
    "renew": lambda store, key: store.renew(key, "a", 30, now=clock.now()),
    "get": lambda store, key: store.get(key),
    "debounce": lambda store, key: store.debounce(
        build_key("debounce", "tests.store_debounce", "item=9"), "t1", encode_call([1], {}),
        now=clock.now(), debounce_for=2.0, max_wait=None, ttl=60.0),
}


def test_stopped_memcached_fails_within_store_timeout(private_memcached: MemcachedServer) -> None:
    """S8/S4/S2: memcached stopped with SIGSTOP (it accepts connections, answers nothing)
    and a cache that sets no timeout: every decision raises StoreUnavailable within
    STORE_TIMEOUT; after SIGCONT the same store answers again at once (no restart, no
    minute of "server marked dead")."""
    with _settings(private_memcached):
        store = get_store("mc")
        key = jobs.unique_sleep.job_key((5,), {})
        assert store.get(key) is None  # connected, and the store answers
        resume = _pause(private_memcached)
        try:
            for name, call in CALLS.items():
                started = time.monotonic()
                with pytest.raises(StoreUnavailable):
                    call(store, key)
                took = time.monotonic() - started
                assert took < STORE_TIMEOUT + SLACK, f"{name} waited {took:.2f}s"
        finally:
            resume()
        # the commands sent while it was stopped run now, late, from the connections the
        # store gave up on, in whatever order memcached reads those sockets (S7 is the job
        # layer's: a dispatch that failed undoes its own lock). The store answers again at
        # once; once the late "a" lock has landed and is released, "b" takes the key.
        deadline = time.monotonic() + 2.0
        while True:
            store.release(key, "a")
            answer = store.acquire(key, "b", 30, now=clock.now())
            if answer.acquired or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert answer.acquired, f"the key stayed with {answer.holder!r} after SIGCONT"
        assert store.release(key, "b") is True
