"""Semantics every store shares (S3, U3, U4): keys compare byte for byte, and a key taken
and released by many threads at once has one holder at a time, on every store of the
``store_name`` fixture (django-redis, locmem, the database store on SQLite, PostgreSQL and
MariaDB)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from django.db import connections

from dedup_jobs import clock
from dedup_jobs.keys import build_key
from tests import jobs


def test_ids_differing_in_case_accents_or_trailing_spaces_are_distinct_locks(
    store_name: str,
) -> None:
    """S3/U1: keys compare byte for byte on every store: ids that differ only in case, in an
    accent or by a trailing space are different locks (a database whose collation folds
    them, as MySQL's and MariaDB's defaults do, must not merge them)."""
    store = jobs.unique_sleep.store()
    idents = ["item=abc", "item=ABC", "item=abć"]
    if store_name.startswith("database"):
        idents.append("item=abc ")  # memcached refuses spaces in keys (A4)
    for n, ident in enumerate(idents):
        key = build_key("unique", "tests.unique_sleep", ident)
        answer = store.acquire(key, f"owner-{n}", 60, now=clock.now())
        assert (answer.acquired, answer.holder) == (True, f"owner-{n}"), ident
    for n, ident in enumerate(idents):
        lock = store.get(build_key("unique", "tests.unique_sleep", ident))
        assert lock is not None and lock.owner == f"owner-{n}", ident


def test_acquire_release_churn_keeps_one_holder(store_name: str) -> None:
    """U3/U4/S3: 8 threads taking and releasing one key 40 times each (the delete and
    concurrent insert that deadlock InnoDB's row-locking transactions): never two holders at
    once, and never a StoreUnavailable (a deadlock is decided again)."""
    store = jobs.unique_sleep.store()
    key = jobs.unique_sleep.job_key(("churn",), {})
    guard = threading.Lock()
    holders: list[str] = []
    overlaps: list[tuple[str, ...]] = []
    barrier = threading.Barrier(8)

    def churn(n: int) -> int:
        barrier.wait(timeout=30)
        taken = 0
        try:
            for i in range(40):
                owner = f"o{n}-{i}"
                if not store.acquire(key, owner, 60, now=clock.now()).acquired:
                    continue
                taken += 1
                with guard:
                    if holders:
                        overlaps.append((*holders, owner))
                    holders.append(owner)
                with guard:
                    holders.remove(owner)
                assert store.release(key, owner)
            return taken
        finally:
            connections.close_all()

    with ThreadPoolExecutor(8) as pool:
        taken = sum(pool.map(churn, range(8)))
    assert overlaps == []
    assert taken > 0
    assert store.get(key) is None
