"""D9: a burst whose message was lost never swallows its id for longer than its own deadline
plus LEASE_SECONDS, on every store that debounces; the next dispatch starts a new burst whose
run answers the stale one's dispatches. Store times are passed in, so no test sleeps."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.core.cache import caches
from django.test import override_settings

from dedup_jobs import clock
from dedup_jobs.keys import build_key
from dedup_jobs.stores.base import (
    ADOPTED,
    CLAIMED,
    STATE_GRACE,
    WAIT,
    BaseStore,
    Debounced,
    encode_call,
)
from dedup_jobs.stores.database import statements
from tests import jobs_debounce as jobs
from tests.conftest import ALL_STORE_PARAMS, store_fixture
from tests.test_debounce_store import store_of
from tests.workers import thread_worker

#: the store-facing tests run on every store that debounces
store_name = store_fixture(ALL_STORE_PARAMS)

T0 = 1_800_000_000.0
KEY = build_key("debounce", "tests.store_debounce", "item=9")
GRACE = 60.0  # LEASE_SECONDS' default


@pytest.fixture(autouse=True)
def _empty_locmem() -> None:
    caches["locmem"].clear()


def dispatch(store: BaseStore, task_id: str, value: int, now: float,
             max_wait: float | None = 10.0) -> Debounced:
    return store.debounce(KEY, task_id, encode_call([value], {}), now=now, debounce_for=2.0,
                          max_wait=max_wait, ttl=STATE_GRACE)


def test_stale_burst_gives_way_to_a_new_one(store_name: str) -> None:
    """D9: a burst (due at its max_wait deadline, T0 + 10) absorbs dispatches until the grace
    has passed, and none of them moves that point: the first dispatch after it starts a new
    burst (published), whose claim hands over the stale burst's ids too; the stale message,
    should it still come, is ADOPTED (it does not run)."""
    store = store_of(store_name)
    assert dispatch(store, "a", 1, T0).new is True
    assert dispatch(store, "b", 2, T0 + 1).superseded == "a"
    # due at T0 + 3 then: still live 59 s later; the burst's deadline caps it at T0 + 10
    assert dispatch(store, "c", 3, T0 + 3 + GRACE - 1).new is False
    # T0 + 10 + GRACE passed: a new burst, though c dispatched only 9 s ago
    fresh = dispatch(store, "d", 4, T0 + 10 + GRACE + 1)
    assert (fresh.new, fresh.message_id, fresh.superseded) == (True, "d", None)
    state = store.get_debounce(KEY)
    assert state is not None and (state.message_id, state.count) == ("d", 1)
    late = store.claim_due(KEY, "a", now=T0 + 10 + GRACE + 5)
    assert late.action == ADOPTED
    claimed = store.claim_due(KEY, "d", now=T0 + 10 + GRACE + 3)
    assert claimed.action == CLAIMED
    assert (claimed.latest_id, claimed.args) == ("d", (4,))
    assert set(claimed.absorbed) == {"a", "b", "c", "d"}


def test_without_max_wait_each_dispatch_is_a_new_due_time(store_name: str) -> None:
    """D1 beside D9: without max_wait the burst is due debounce_for after its last dispatch,
    so a dispatch inside the grace keeps it live; one past it starts over."""
    store = store_of(store_name)
    dispatch(store, "a", 1, T0, max_wait=None)
    assert dispatch(store, "b", 2, T0 + 2 + GRACE - 1, max_wait=None).new is False
    assert store.claim_due(KEY, "a", now=T0 + GRACE + 2).action == WAIT
    assert dispatch(store, "c", 3, T0 + 2 * GRACE + 5, max_wait=None).new is True


def test_withdraw_a_failed_dispatch(store_name: str) -> None:
    """S7, the undo of a dispatch whose reply was lost after it was absorbed: the burst
    forgets it and, as it was the latest, runs with the arguments of the dispatch before
    it. The burst's own message and unknown ids are not withdrawn; a re-sent undo changes
    nothing more."""
    store = store_of(store_name)
    dispatch(store, "a", 1, T0)
    dispatch(store, "b", 2, T0 + 0.5)
    dispatch(store, "c", 3, T0 + 1)
    assert store.withdraw(KEY, "c") is True
    assert store.withdraw(KEY, "c") is False
    assert store.withdraw(KEY, "a") is False
    assert store.withdraw(KEY, "nobody") is False
    claimed = store.claim_due(KEY, "a", now=T0 + 10)
    assert claimed.action == CLAIMED
    assert (claimed.latest_id, claimed.args, claimed.absorbed) == ("b", (2,), ("a", "b"))


@pytest.mark.parametrize("database", [
    pytest.param("postgres", marks=pytest.mark.postgres),
    pytest.param("mariadb", marks=pytest.mark.mariadb),
])
def test_row_locking_path_gives_way(database: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """D9 on the row-locking path MySQL 8 takes (no RETURNING), here on PostgreSQL and on
    MariaDB: the same answers as the one-statement upsert."""
    monkeypatch.setattr(statements, "dialect", lambda connection: None)
    with override_settings(DEDUP_JOBS={"STORE": "database", "DATABASE_ALIAS": database}):
        store = store_of("database")
        dispatch(store, "a", 1, T0)
        assert dispatch(store, "b", 2, T0 + 2 + GRACE - 1).new is False  # due then: T0 + 10
        assert dispatch(store, "c", 3, T0 + 10 + GRACE + 1).new is True
        assert store.claim_due(KEY, "a", now=T0 + 10 + GRACE + 5).action == ADOPTED
        claimed = store.claim_due(KEY, "c", now=T0 + 10 + GRACE + 5)
        assert claimed.action == CLAIMED and set(claimed.absorbed) == {"a", "b", "c"}


@pytest.fixture
def later(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Moves ``clock.now`` (the dispatcher's and the in-thread worker's) ahead."""
    offset = [0.0]
    real = clock.now
    monkeypatch.setattr(clock, "now", lambda: real() + offset[0])

    def move(seconds: float) -> None:
        offset[0] += seconds

    yield move


@pytest.mark.redis
@pytest.mark.worker
@pytest.mark.usefixtures("store_name")
@pytest.mark.parametrize("store_name", ["redis", "database"], indirect=True)
def test_burst_whose_message_was_lost_runs_on_the_next_dispatch(app: Any, later: Any) -> None:
    """D9, issue 21 case 8: a burst whose message was lost (purged before any worker took
    it) does not swallow its id: once it is past its deadline plus LEASE_SECONDS, the next
    dispatch publishes, runs once with its arguments, and the lost dispatch's AsyncResult
    gets that run's result too."""
    lost = jobs.debounce_record.delay(31, 1)
    app.control.purge()
    later(3.0 + GRACE + 1)  # debounce_record: max_wait 3
    with thread_worker(app):
        healed = jobs.debounce_record.delay(31, 2)
        assert healed.get(timeout=15) == 2
        assert lost.get(timeout=5) == 2
    assert [v for v in jobs.values("record") if v[0] == 31] == [[31, 2]]


@pytest.mark.redis
@pytest.mark.worker
@pytest.mark.usefixtures("store_name")
@pytest.mark.parametrize("store_name", ["redis", "database"], indirect=True)
def test_late_message_of_a_stale_burst_does_not_run_twice(app: Any, later: Any) -> None:
    """D9: a stale burst's message that still comes (a worker outage longer than the grace)
    after a newer burst adopted its dispatch is dropped: the newer burst's run answers both
    dispatches, and the job runs once."""
    late = jobs.debounce_record.delay(32, 1)  # its message waits: no worker yet
    later(3.0 + GRACE + 1)
    newer = jobs.debounce_record.delay(32, 2)
    with thread_worker(app):
        assert newer.get(timeout=15) == 2
        assert late.get(timeout=5) == 2
    assert [v for v in jobs.values("record") if v[0] == 32] == [[32, 2]]
