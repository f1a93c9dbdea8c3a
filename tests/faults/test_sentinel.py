"""S6 on Redis Sentinel: a primary, a replica and three sentinels of the tests' own
(tests/faults/sentinel.py), a django-redis cache with its Sentinel client, a stream of
dispatch decisions, and the primary killed by its pid in the middle. Prints the measured
failover window and what asynchronous replication lost."""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from dedup_jobs import clock
from dedup_jobs.exceptions import StoreUnavailable
from dedup_jobs.keys import build_key
from dedup_jobs.stores import get_store
from tests.faults.sentinel import sentinel_cache, sentinel_setup

pytestmark = [pytest.mark.redis]

STORE_TIMEOUT = 1.0
SLACK = 0.5
#: how long the stream of decisions goes on after the kill, at most
AFTER_KILL = 30.0


def test_sentinel_failover_fails_fast_then_works_again(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """S6: while the primary is unreachable, decisions fail fast with StoreUnavailable (never
    longer than STORE_TIMEOUT); after the promotion they work again on the same store object,
    without a restart. What asynchronous replication loses is counted and printed."""
    with sentinel_setup() as setup:
        caches = {**settings.CACHES, "sentinel": sentinel_cache(setup)}
        options = {**settings.DEDUP_JOBS, "STORE": "sentinel", "STORE_TIMEOUT": STORE_TIMEOUT}
        with override_settings(CACHES=caches, DEDUP_JOBS=options):
            store = get_store("sentinel")
            taken: list[tuple[Any, float]] = []  # (key, when its acquire was answered)
            calls: list[tuple[float, bool, float]] = []  # (at, answered, took)

            def decide(n: int) -> None:
                key = build_key("unique", "tests.sentinel", f"n={n}")
                started = time.monotonic()
                try:
                    answered = store.acquire(key, f"owner-{n}", 600, now=clock.now()).acquired
                except StoreUnavailable:
                    answered = False
                else:
                    taken.append((key, time.monotonic()))
                calls.append((started, answered, time.monotonic() - started))

            stop = threading.Event()

            def stream() -> None:  # decisions as fast as they go, across the kill
                n = 0
                while not stop.is_set():
                    decide(n)
                    n += 1

            worker = threading.Thread(target=stream, daemon=True)
            worker.start()
            time.sleep(1.0)  # a healthy stream first
            old_primary = setup.primary()
            setup.kill_primary()
            # taken once the primary is reaped: a decision sent between the two calls could
            # still be answered by the old primary and count as "worked again"
            killed_at = time.monotonic()
            recovered_at = None
            while time.monotonic() - killed_at < AFTER_KILL:
                answered = [at for at, ok, _took in list(calls) if ok and at > killed_at]
                if answered:
                    recovered_at = answered[0]
                    break
                time.sleep(0.05)
            time.sleep(0.5)
            stop.set()
            worker.join(timeout=10)
            # The client found the promoted replica through one sentinel; the one that
            # setup.primary() asks may learn of the promotion a moment later (seen in CI:
            # decisions answered again while it still named the killed primary).
            new_primary = setup.primary()
            deadline = time.monotonic() + 10.0
            while new_primary == old_primary and time.monotonic() < deadline:
                time.sleep(0.1)
                new_primary = setup.primary()
            after = [call for call in calls if call[0] >= killed_at]
            failed = [call for call in after if not call[1]]
            slowest = max(took for _at, _ok, took in calls)
            # what the promoted replica kept of the locks acknowledged before the kill
            before = [key for key, done in taken if done < killed_at]
            lost = [key for key in before if store.get(key) is None]
    window = (recovered_at - killed_at) if recovered_at is not None else float("nan")
    with capsys.disabled():  # the measured window shows in every run's output, CI's too
        print(f"\nS6 sentinel failover: primary {old_primary} -> {new_primary}; "
              f"{len(after)} decisions after the kill, {len(failed)} StoreUnavailable; "
              f"window kill -> first decision answered again {window:.2f}s; slowest call "
              f"{slowest:.2f}s; locks acknowledged before the kill and lost with it "
              f"{len(lost)} of {len(before)}")
    assert recovered_at is not None, "decisions never worked again after the promotion"
    assert new_primary is not None and new_primary != old_primary
    assert failed, "no decision failed while the primary was gone: the kill did not land"
    assert slowest < STORE_TIMEOUT + SLACK, f"a decision waited {slowest:.2f}s"


@pytest.mark.parametrize("store_name", ["sentinel"], indirect=True)
def test_sentinel_decisions_are_one_round_trip_and_locks_are_listed(
    store_name: str, sentinel_store: Any
) -> None:
    """S1 / A1 on Sentinel: through django-redis's SentinelClient, a first dispatch, a
    duplicate, the worker start check and the finish release are one EVALSHA each, counted
    on the primary (MONITOR); 10,000 held locks are listed and paged by the index."""
    import kombu

    from dedup_jobs.jobs.base import HEADER
    from tests import jobs
    from tests.test_stores import MEMORY, delta, load_scripts

    _cache, setup = sentinel_store
    primary = setup.primary_server.client
    task = jobs.unique_sleep
    store = task.store()
    load_scripts(store)
    with kombu.Connection(MEMORY) as memory:
        first: list[Any] = []
        assert delta(primary, lambda: first.append(
            task.apply_async((1,), connection=memory))) == {"evalsha": 1}
        assert delta(primary, lambda: task.apply_async((1,), connection=memory)) == {
            "evalsha": 1}
    key = task.job_key((1,), {})
    header = {HEADER: key.as_header(store_name)}
    assert delta(primary, lambda: task.apply((1,), task_id=first[0].id, headers=header)) == {
        "evalsha": 2}
    now = clock.now()
    for n in range(10_000):
        store.acquire(build_key("unique", "tests.sentinel", f"n={n:05d}"), f"o{n}", 600, now=now)
    page = store.lock_page(offset=0, limit=100, now=clock.now())
    assert page.total == 10_000 and len(page.items) == 100 and page.has_more
    last = store.lock_page(offset=9_900, limit=100, now=clock.now())
    assert len(last.items) == 100 and not last.has_more
    seen = {lock.ident for lock in page.items} | {lock.ident for lock in last.items}
    assert len(seen) == 200


def test_a_stopped_primary_fails_within_store_timeout_without_a_socket_timeout() -> None:
    """S8 on Sentinel: a SentinelClient cache that sets no socket timeout (its own calls
    would wait forever on a stopped primary): with the primary SIGSTOPped, every decision
    raises StoreUnavailable within STORE_TIMEOUT. The sentinels wait a minute before they
    call the primary down, so no failover answers meanwhile."""
    from tests.faults.test_bounded import check_silent

    with sentinel_setup(down_after_ms=60_000) as setup:
        caches = {**settings.CACHES, "silent": sentinel_cache(setup, socket_timeout=None)}
        check_silent(caches, stall=setup.primary_server, proxy=None)


def test_a_stopped_sentinel_is_passed_over_within_store_timeout() -> None:
    """S8 on Sentinel: the first of the three sentinels SIGSTOPped (it accepts connections
    and never answers) and a cache that sets no socket timeout: a store's first decision
    (which asks a sentinel for the primary) passes over the stopped one to the next and is
    answered within STORE_TIMEOUT."""
    with sentinel_setup(down_after_ms=60_000) as setup:
        caches = {**settings.CACHES, "silent": sentinel_cache(setup, socket_timeout=None)}
        options = {**settings.DEDUP_JOBS, "STORE": "silent", "STORE_TIMEOUT": STORE_TIMEOUT}
        stopped = setup.processes[0]
        os.kill(stopped.pid, signal.SIGSTOP)
        resume = threading.Timer(20, os.kill, (stopped.pid, signal.SIGCONT))  # never a hang
        resume.start()
        try:
            with override_settings(CACHES=caches, DEDUP_JOBS=options):
                store = get_store("silent")
                key = build_key("unique", "tests.sentinel", "n=first")
                started = time.monotonic()
                taken = store.acquire(key, "owner", 60, now=clock.now()).acquired
                took = time.monotonic() - started
        finally:
            resume.cancel()
            os.kill(stopped.pid, signal.SIGCONT)
        assert taken
        assert took < STORE_TIMEOUT + SLACK, f"the first decision waited {took:.2f}s"


def test_a_django_valkey_sentinel_cache_gets_a_store_on_the_primary() -> None:
    """S1 on Sentinel, django-valkey: its SentinelClient (0.4) puts ``is_master=0`` in the
    primary's URL too (one query dict shared by both URLs) and sets the primary pool's
    ``is_master`` to False after making it; that pool's connections still go to the primary
    (they read the pool's proxy, made with the URL's truthy "0"). The store's own Sentinel
    pool goes to the primary as well: every decision writes (a replica answers READONLY)."""
    with sentinel_setup() as setup:
        caches = {**settings.CACHES, "vsentinel": sentinel_cache(setup, library="django-valkey")}
        options = {**settings.DEDUP_JOBS, "STORE": "vsentinel", "STORE_TIMEOUT": STORE_TIMEOUT}
        with override_settings(CACHES=caches, DEDUP_JOBS=options):
            from django.core.cache import caches as django_caches

            django_caches["vsentinel"].set("probe", 1)  # the cache itself writes to the primary
            store = get_store("vsentinel")
            key = build_key("unique", "tests.sentinel", "n=valkey")
            assert store.acquire(key, "owner", 60, now=clock.now()).acquired
            assert store.release(key, "owner")


def test_a_stopped_primary_fails_within_store_timeout_through_django_valkey() -> None:
    """S8 on Sentinel, django-valkey's SentinelClient without a socket timeout: with the
    primary SIGSTOPped, every decision raises StoreUnavailable within STORE_TIMEOUT."""
    from tests.faults.test_bounded import check_silent

    with sentinel_setup(down_after_ms=60_000) as setup:
        caches = {**settings.CACHES,
                  "silent": sentinel_cache(setup, socket_timeout=None,
                                            library="django-valkey")}
        check_silent(caches, stall=setup.primary_server, proxy=None)
