"""S3: the database store compares expiry against the database server's clock, never the
client's. Each test shifts the client's clock seam (``dedup_jobs.clock.now``) an hour or two
away from the server's, on SQLite (whose "server" clock is the host's own), PostgreSQL and
MariaDB, and shows that locks and debounce state still expire by the server's time."""

from __future__ import annotations

import time
from typing import Any

import pytest

from dedup_jobs import clock
from dedup_jobs.keys import build_key
from dedup_jobs.stores import get_store
from dedup_jobs.stores.base import ADOPTED, CLAIMED, BaseStore, Renewed, encode_call
from tests import jobs
from tests.conftest import DATABASE_STORE_PARAMS

pytestmark = pytest.mark.parametrize("store_name", DATABASE_STORE_PARAMS, indirect=True)

HOUR = 3600.0


def skew(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """The client's clock seam runs ``seconds`` ahead of the real (server's) time."""
    monkeypatch.setattr(clock, "now", lambda: time.time() + seconds)


def store() -> BaseStore:
    return get_store("database")


def test_a_client_ahead_does_not_take_a_held_lock(
    store_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """S3/U3: a lock taken for 60 s is still held for a dispatcher, a worker and a lease whose
    clock runs an hour ahead (by its own clock the lock expired long ago), and the admin's
    listing from that host still shows it."""
    key = jobs.unique_sleep.job_key((1,), {})
    assert store().acquire(key, "a", 60, now=clock.now()).acquired
    skew(monkeypatch, HOUR)
    answer = store().acquire(key, "b", 60, now=clock.now())
    assert (answer.acquired, answer.holder) == (False, "a")
    started = store().start(key, "b", 30, now=clock.now(), release=False, delivery="d-b")
    assert (started.run, started.holder) == (False, "a")
    assert store().renew(key, "b", 30, now=clock.now()) == Renewed(held=False, holder="a")
    lock = store().get(key)
    assert lock is not None and lock.owner == "a"
    assert [info.owner for info in store().iter_locks()] == ["a"]
    assert list(store().iter_expired()) == []
    page = store().lock_page(offset=0, limit=10, now=clock.now())
    assert [info.owner for info in page.items] == ["a"]


def test_a_client_behind_does_not_lengthen_a_lock(
    store_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """S3/U5: a lock taken for 0.3 s by a dispatcher whose clock runs two hours behind expires
    0.3 s later by the server's clock (not two hours later): the next dispatcher takes it,
    whatever its own clock says, and ``clear_stale_locks`` sees it expired meanwhile."""
    key = jobs.unique_sleep.job_key((2,), {})
    skew(monkeypatch, -2 * HOUR)
    assert store().acquire(key, "a", 0.3, now=clock.now()).acquired
    lock = store().get(key)
    assert lock is not None and lock.expires_at == pytest.approx(time.time() + 0.3, abs=2)
    time.sleep(0.6)
    assert [info.owner for info in store().iter_expired()] == ["a"]
    assert store().get(key) is None
    answer = store().acquire(key, "b", 60, now=clock.now())
    assert (answer.acquired, answer.holder) == (True, "b")


def test_a_lease_renewed_by_a_skewed_worker_lasts_by_the_server_clock(
    store_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """S3/U5: a running job's lease renewed from a worker whose clock runs two hours behind
    is extended to the server's now + lease, not to a time already past on the server."""
    key = jobs.unique_sleep.job_key((3,), {})
    assert store().start(key, "a", 30, now=clock.now(), release=False, delivery="d1").run
    skew(monkeypatch, -2 * HOUR)
    assert store().renew(key, "a", 120, now=clock.now(), delivery="d1") == Renewed(held=True)
    lock = store().get(key)
    assert lock is not None and lock.expires_at == pytest.approx(time.time() + 120, abs=2)
    monkeypatch.undo()
    other = store().acquire(key, "b", 60, now=clock.now())
    assert (other.acquired, other.holder) == (False, "a")


DEBOUNCE_KEY = build_key("debounce", "tests.clock_debounce", "item=4")


def dispatch(task_id: str) -> Any:
    return store().debounce(DEBOUNCE_KEY, task_id, encode_call([4], {}), now=clock.now(),
                            debounce_for=2.0, max_wait=None, ttl=60.0)


def test_a_debounce_burst_expires_by_the_server_clock(
    store_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """S3/D6/D9: a pending burst joined by a dispatcher whose clock runs two hours ahead.
    The row's expiry is the server's (it has not expired), but D9's grace is measured on the
    dispatcher's clock, as the burst's run time is: by that clock the burst was due two hours
    ago, so it is stale and the dispatch starts a new burst that ADOPTS the old one's ids.
    Nothing runs twice: the old message, when it comes, is answered "adopted" (dropped), and
    the new burst's claim answers both dispatches. One burst stays listed."""
    assert dispatch("first").new
    skew(monkeypatch, 2 * HOUR)
    later = dispatch("second")
    assert (later.new, later.message_id, later.superseded) == (True, "second", None)
    state = store().get_debounce(DEBOUNCE_KEY)
    assert state is not None and state.message_id == "second"
    assert [s.message_id for s in store().iter_debounces()] == ["second"]
    assert store().claim_due(DEBOUNCE_KEY, "first", now=clock.now()).action == ADOPTED
    claimed = store().claim_due(DEBOUNCE_KEY, "second", now=clock.now() + 3)  # due then
    assert claimed.action == CLAIMED and set(claimed.absorbed) == {"first", "second"}
