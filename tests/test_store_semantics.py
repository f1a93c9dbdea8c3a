"""Semantics every store shares (S3, U3, U4): keys compare byte for byte, and a key taken
and released by many threads at once has one holder at a time, on every store of the
``store_name`` fixture (django-redis, locmem, the database store on SQLite, PostgreSQL and
MariaDB)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.conf import settings
from django.db import connections
from django.test import override_settings

from dedup_jobs import clock
from dedup_jobs.keys import build_key
from dedup_jobs.stores import get_store
from dedup_jobs.stores.base import CLAIMED, BaseStore, Debounced, encode_call
from dedup_jobs.stores.database import statements
from tests import jobs
from tests.conftest import DATABASE_STORE_PARAMS, database_alias


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
    churn(jobs.unique_sleep.store())


def churn(store: BaseStore) -> None:
    key = jobs.unique_sleep.job_key(("churn",), {})
    guard = threading.Lock()
    holders: list[str] = []
    overlaps: list[tuple[str, ...]] = []
    barrier = threading.Barrier(8)

    def run(n: int) -> int:
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
        taken = sum(pool.map(run, range(8)))
    assert overlaps == []
    assert taken > 0
    assert store.get(key) is None


def debounce_burst(store: BaseStore) -> None:
    """8 threads x 10 dispatches of one debounce id: one starts the burst, each id is
    absorbed once, and every dispatch but the last is superseded once."""
    key = build_key("debounce", "tests.semantics", "item=1")
    answers: list[Debounced] = []
    barrier = threading.Barrier(8)

    def run(n: int) -> None:
        barrier.wait(timeout=30)
        try:
            for i in range(10):
                answers.append(store.debounce(key, f"t{n}-{i}", encode_call([i], {}),
                                              now=clock.now(), debounce_for=2.0, max_wait=None,
                                              ttl=60.0))
        finally:
            connections.close_all()

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(run, range(8)))
    assert len(answers) == 80 and sum(a.new for a in answers) == 1
    superseded = [a.superseded for a in answers if a.superseded]
    assert len(superseded) == len(set(superseded)) == 79
    state = store.get_debounce(key)
    assert state is not None and state.count == 80
    claimed = store.claim_due(key, state.message_id, now=clock.now() + 60)
    assert claimed.action == CLAIMED and len(claimed.absorbed) == 80


@pytest.mark.mariadb
def test_mysql_form_on_mariadb_is_atomic(monkeypatch: pytest.MonkeyPatch) -> None:
    """S3/U3/D6: MySQL 8's form (the upsert and a read of its row in one transaction, no
    RETURNING), run on MariaDB: acquire-and-release churn keeps one holder, and concurrent
    debounced dispatches are absorbed exactly once each."""
    monkeypatch.setattr(statements, "dialect", lambda connection: "duplicate_key_read")
    dedup = {**settings.DEDUP_JOBS, "STORE": "database", "DATABASE_ALIAS": "mariadb"}
    with override_settings(DEDUP_JOBS=dedup):
        churn(get_store("database"))
        debounce_burst(get_store("database"))


@pytest.mark.parametrize("store_name", DATABASE_STORE_PARAMS, indirect=True)
def test_row_locking_path_decides_as_the_upsert(
    store_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """S3/U4/W1/W5/S7: the row-locking path (databases without a one-statement form) answers
    every lock decision as the upsert does, on SQLite, PostgreSQL and MariaDB: the store
    contract's lock tests, run on it."""
    from dedup_jobs.models import JobLock
    from tests import test_stores as contract

    monkeypatch.setattr(statements, "dialect", lambda connection: None)
    checks = [
        contract.test_release_is_compare_and_delete,
        contract.test_renew_never_shortens_and_only_for_owner,
        contract.test_reentrant_acquire_refreshes_only_for_the_owner,
        contract.test_worker_start_decides_by_owner,
        contract.test_worker_start_holds_a_queued_lock,
        contract.test_worker_start_resent_answers_as_first,
        contract.test_second_delivery_of_a_running_message_is_live,
    ]
    for check in checks:
        JobLock.objects.using(database_alias(store_name)).all().delete()
        check(store_name)
