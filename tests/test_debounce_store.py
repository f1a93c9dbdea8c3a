"""The debounce half of every store (django-redis, Django's RedisCache, django-valkey on
Valkey, locmem, database on SQLite and PostgreSQL): one dispatch, one claim, the state the
admin lists. Times are passed in, so no test sleeps."""

from __future__ import annotations

import threading
import time
from typing import Any

import kombu
import pytest
from django.core.cache import caches
from django.db import connections
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from dedup_jobs import clock
from dedup_jobs.jobs.base import HEADER
from dedup_jobs.keys import build_key
from dedup_jobs.stores import get_store
from dedup_jobs.stores.base import (
    ADOPTED,
    CLAIMED,
    MISSING,
    OTHER,
    WAIT,
    BaseStore,
    Debounced,
    encode_call,
)
from dedup_jobs.stores.database import statements
from tests.conftest import ALL_STORE_PARAMS, store_fixture
from tests.test_stores import MEMORY, delta

#: the store-facing tests run on every store, the other Redis-protocol backends included
store_name = store_fixture(ALL_STORE_PARAMS)

T0 = 1_800_000_000.0
KEY = build_key("debounce", "tests.store_debounce", "item=1")


@pytest.fixture(autouse=True)
def _empty_locmem() -> None:
    caches["locmem"].clear()


def store_of(store_name: str) -> BaseStore:
    return get_store("database" if store_name.startswith("database") else store_name)


def dispatch(
    store: BaseStore, task_id: str, value: int, now: float, *, max_wait: float | None = 10.0
) -> Debounced:
    return store.debounce(
        KEY,
        task_id,
        encode_call([value], {"flag": value}),
        now=now,
        debounce_for=2.0,
        max_wait=max_wait,
        ttl=60.0,
    )


def test_burst_absorbs_and_claims_latest(store_name: str) -> None:
    """D1/D3/D4: the first dispatch starts a burst (publish); later ones are absorbed, each
    superseding the previous latest; the claim hands over the last arguments and every id."""
    store = store_of(store_name)
    first = dispatch(store, "a", 1, T0)
    assert (first.new, first.message_id, first.superseded) == (True, "a", None)
    second = dispatch(store, "b", 2, T0 + 0.5)
    assert (second.new, second.message_id, second.superseded) == (False, "a", "a")
    third = dispatch(store, "c", 3, T0 + 1.0)
    assert (third.new, third.message_id, third.superseded) == (False, "a", "b")
    state = store.get_debounce(KEY)
    assert state is not None
    assert (state.count, state.message_id, state.latest_id) == (3, "a", "c")
    assert (state.args, state.kwargs) == ((3,), {"flag": 3})
    assert state.first_dispatch_at == pytest.approx(T0, abs=0.002)
    assert state.last_dispatch_at == pytest.approx(T0 + 1.0, abs=0.002)
    assert state.runs_at == pytest.approx(T0 + 3.0, abs=0.002)
    assert state.deadline == pytest.approx(T0 + 10.0, abs=0.002)
    # The message woke at its first ETA (T0 + 2): the burst moved, so it waits.
    due = store.claim_due(KEY, "a", now=T0 + 2.0)
    assert due.action == WAIT
    assert due.wait_until == pytest.approx(T0 + 3.0, abs=0.002)
    claimed = store.claim_due(KEY, "a", now=T0 + 3.0)
    assert claimed.action == CLAIMED
    assert (claimed.latest_id, claimed.args, claimed.kwargs) == ("c", (3,), {"flag": 3})
    assert claimed.absorbed == ("a", "b", "c")
    assert store.get_debounce(KEY) is None
    # D5: after the claim a dispatch starts a new burst.
    assert dispatch(store, "d", 4, T0 + 3.1).new is True


def test_deadline_caps_runs_at(store_name: str) -> None:
    """D2: under a steady stream the burst is due at first dispatch + max_wait."""
    store = store_of(store_name)
    for i in range(9):
        dispatch(store, f"id{i}", i, T0 + i, max_wait=5.0)
    state = store.get_debounce(KEY)
    assert state is not None and state.runs_at == pytest.approx(T0 + 5.0, abs=0.002)
    due = store.claim_due(KEY, "id0", now=T0 + 5.0)
    assert due.action == CLAIMED and due.args == (8,) and len(due.absorbed) == 9


def test_missing_and_other(store_name: str) -> None:
    """D7: a message whose state is gone gets MISSING, one whose key holds a newer burst
    gets OTHER; neither touches the newer burst."""
    store = store_of(store_name)
    assert store.claim_due(KEY, "gone", now=T0).action == MISSING
    dispatch(store, "new", 1, T0)
    assert store.claim_due(KEY, "gone", now=T0 + 5).action == OTHER
    assert store.claim_due(KEY, "new", now=T0 + 5).action == CLAIMED


@pytest.mark.django_db(databases=["default"], transaction=True)
def test_expired_state_starts_a_new_burst() -> None:
    """D7/D9: a burst whose database row outlived its ttl (its message long gone) does not
    swallow new dispatches: the next dispatch starts a new burst and publishes, adopting the
    old burst's ids (the old message, should it come, is ADOPTED). (Cache stores expire the
    key itself.) The row expires by the database server's clock (S3)."""
    with override_settings(DEDUP_JOBS={"STORE": "database", "DATABASE_ALIAS": "default"}):
        store = get_store("database")
        store.debounce(KEY, "old", encode_call([1], {}), now=T0, debounce_for=0.1,
                       max_wait=None, ttl=0.2)
        time.sleep(0.5)
        assert dispatch(store, "new", 2, T0 + 100).new is True
        assert store.claim_due(KEY, "old", now=T0 + 200).action == ADOPTED


@pytest.mark.parametrize("threads", [8])
def test_concurrent_dispatches_are_atomic(store_name: str, threads: int) -> None:
    """D6/S1: N concurrent dispatchers of one id: exactly one starts the burst, every id is
    absorbed once, and every dispatch but the last is superseded exactly once."""
    store = store_of(store_name)
    answers: list[Debounced] = []
    barrier = threading.Barrier(threads)

    def run(n: int) -> None:
        barrier.wait()
        for i in range(10):
            answers.append(dispatch(store, f"t{n}-{i}", i, T0 + 0.001 * i))
        if store_name.startswith("database"):
            from django.db import connections

            connections.close_all()

    workers = [threading.Thread(target=run, args=(n,)) for n in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=60)
    assert len(answers) == threads * 10
    assert sum(a.new for a in answers) == 1
    superseded = [a.superseded for a in answers if a.superseded]
    assert len(superseded) == len(set(superseded)) == threads * 10 - 1
    state = store.get_debounce(KEY)
    assert state is not None and state.count == threads * 10
    claimed = store.claim_due(KEY, state.message_id, now=T0 + 60)
    assert sorted(claimed.absorbed) == sorted(
        f"t{n}-{i}" for n in range(threads) for i in range(10)
    )
    assert claimed.latest_id not in superseded


def test_iter_debounces_lists_pending(store_name: str) -> None:
    """A1/S1: the django-redis and database stores list pending debounces, soonest due first
    (the admin's Debounced jobs page); other caches say why they cannot."""
    store = store_of(store_name)
    for n, offset in ((1, 3.0), (2, 1.0)):
        key = build_key("debounce", "tests.store_debounce", f"item={n}")
        store.debounce(
            key,
            f"m{n}",
            encode_call([n], {}),
            now=T0 + offset,
            debounce_for=2.0,
            max_wait=None,
            ttl=60.0,
        )
    if not store.can_list:
        with pytest.raises(NotImplementedError, match="cannot list"):
            list(store.iter_debounces())
        return
    listed = [s for s in store.iter_debounces(batch_size=1) if s.message_id in ("m1", "m2")]
    assert [s.ident for s in listed] == ["item=2", "item=1"]
    assert listed[0].deadline is None and listed[0].args == (2,)


@pytest.mark.parametrize("database", [
    pytest.param("postgres", marks=pytest.mark.postgres),
    pytest.param("mariadb", marks=pytest.mark.mariadb),
])
def test_row_locking_path(database: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """S3: the row-locking path MySQL 8 takes (no RETURNING) behaves as the one-statement
    upsert, here on PostgreSQL and on MariaDB (InnoDB, as MySQL)."""
    monkeypatch.setattr(statements, "dialect", lambda connection: None)
    with override_settings(DEDUP_JOBS={"STORE": "database", "DATABASE_ALIAS": database}):
        store = get_store("database")
        assert dispatch(store, "a", 1, T0).new is True
        second = dispatch(store, "b", 2, T0 + 1)
        assert (second.new, second.superseded) == (False, "a")
        assert store.claim_due(KEY, "a", now=T0 + 2).action == WAIT
        claimed = store.claim_due(KEY, "a", now=T0 + 3)
        assert claimed.action == CLAIMED and claimed.absorbed == ("a", "b")
        assert claimed.args == (2,)
        store.debounce(KEY, "old", encode_call([1], {}), now=T0, debounce_for=0.1,
                       max_wait=None, ttl=0.2)
        time.sleep(0.5)  # the row expired, by the database server's clock
        assert dispatch(store, "new", 2, T0 + 100).new is True


@pytest.mark.django_db(databases="__all__")
@pytest.mark.parametrize("database", [
    "default",
    pytest.param("postgres", marks=pytest.mark.postgres),
    pytest.param("mariadb", marks=pytest.mark.mariadb),
])
def test_expired_claim_records_are_swept(database: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """S7: a claim leaves one record per burst on the database store (a claim made again gets
    its answer); expired ones are deleted by a later claim's sweep, so they never pile up, and
    a record still in its CLAIM_RECORD_SECONDS is kept."""
    from dedup_jobs.stores.database import debounce as database_debounce
    from dedup_jobs.stores.database.models import PendingDebounce

    monkeypatch.setattr(database_debounce, "SWEEP_EVERY", 0.0)
    with override_settings(DEDUP_JOBS={"STORE": "database", "DATABASE_ALIAS": database}):
        store = get_store("database")
        records = PendingDebounce.objects.using(database).filter(count=0)
        assert dispatch(store, "a", 1, T0).new
        assert store.claim_due(KEY, "a", now=T0 + 5).action == CLAIMED
        assert list(records.values_list("message_id", flat=True)) == ["a"]
        records.update(expires_at=clock.db_datetime(time.time() - 1))
        assert dispatch(store, "b", 2, T0 + 10).new
        assert store.claim_due(KEY, "b", now=T0 + 15).action == CLAIMED
        assert list(records.values_list("message_id", flat=True)) == ["b"]
        assert store.claim_due(KEY, "b", now=T0 + 15).absorbed == ("b",)


def test_redis_one_round_trip_per_dispatch_and_claim(
    family_store: str, server_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """S1 / section 8: on every Redis-protocol backend (django-redis, Django's RedisCache,
    django-valkey on Valkey) a debounced dispatch (first or absorbed) is one EVALSHA, and so
    is the worker's claim of a due burst, counted on the server."""
    from tests import jobs_debounce

    redis_client = server_client
    task = jobs_debounce.debounce_record
    with kombu.Connection(MEMORY) as memory:
        warm = task.apply_async((0, 0), connection=memory)  # loads the script once
        first: list[Any] = []
        assert delta(
            redis_client, lambda: first.append(task.apply_async((1, 1), connection=memory))
        ) == {"evalsha": 1}
        assert delta(redis_client, lambda: task.apply_async((1, 2), connection=memory)) == {
            "evalsha": 1
        }
    key = task.job_key((1, 2), {})
    header = {HEADER: key.as_header(family_store)}
    later = clock.now() + 5
    monkeypatch.setattr(clock, "now", lambda: later)
    # Load the claim script too (another test may have run SCRIPT FLUSH).
    task.store().claim_due(task.job_key((0, 0), {}), warm.id, now=later)
    ran: list[Any] = []
    assert delta(
        redis_client,
        lambda: ran.append(task.apply((1, 1), task_id=first[0].id, headers=header)),
    ) == {"evalsha": 1}
    assert ran[0].get() == 2
    assert task.store().get_debounce(key) is None


@pytest.mark.postgres
@override_settings(DEDUP_JOBS={"STORE": "database", "DATABASE_ALIAS": "postgres"})
def test_postgres_dispatch_and_claim_are_one_statement() -> None:
    """S3 / section 8: on PostgreSQL a debounced dispatch is one statement (first and
    absorbed alike), and so is claiming a due burst (the row moved to its claim record, S7)."""
    store = get_store("database")
    for task_id, now in (("a", T0), ("b", T0 + 1)):
        with CaptureQueriesContext(connections["postgres"]) as queries:
            dispatch(store, task_id, 1, now)
        assert len(queries) == 1 and "ON CONFLICT" in queries[0]["sql"]
    with CaptureQueriesContext(connections["postgres"]) as queries:
        assert store.claim_due(KEY, "a", now=T0 + 3).action == CLAIMED
    assert len(queries) == 1 and queries[0]["sql"].lstrip().startswith("UPDATE")
