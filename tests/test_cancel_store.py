"""L2 (``on_duplicate = "cancel_running"``) in the stores: ``cancel_take`` takes the lock (over)
and asks the key's running marker to stop, ``renew`` of the marker reads the request back,
``undo_cancel`` withdraws what a failed dispatch asked (S7) — on every store."""

from __future__ import annotations

from dedup_jobs import clock
from dedup_jobs.stores import get_store
from dedup_jobs.stores.base import BaseStore, running_key
from tests import jobs_flow
from tests.conftest import ALL_STORE_PARAMS, store_fixture

store_name = store_fixture(ALL_STORE_PARAMS)


def _store(store_name: str) -> BaseStore:
    return get_store("database" if store_name.startswith("database") else store_name)


def _running(store: BaseStore, key: object, owner: str) -> None:
    """``owner`` dispatched and started, as an exclusive run does: its lock released, the
    key's running marker its own."""
    run = running_key(key)  # type: ignore[arg-type]
    assert store.acquire(key, owner, 60, now=clock.now()).acquired  # type: ignore[arg-type]
    assert store.start_exclusive(key, run, owner, 60, now=clock.now(),  # type: ignore[arg-type]
                                 delivery=f"d-{owner}").run


def test_cancel_take_asks_the_running_copy_to_stop(store_name: str) -> None:
    """Free lock, nothing running: taken, nobody cancelled. A run in progress: the next
    dispatch takes the lock and names the run it asked to stop; the run's renewal reads
    that owner back; a re-send answers the same; a later dispatch replaces the queued one
    and does not count the run as cancelled again, but is the one it names now."""
    store, key = _store(store_name), jobs_flow.no_overlap.job_key((31,), {})
    run = running_key(key)
    first = store.cancel_take(key, run, "one", 60, now=clock.now(), request="r-1")
    assert (first.acquired, first.replaced, first.cancelled) == (True, None, None)
    assert store.start_exclusive(key, run, "one", 60, now=clock.now(), delivery="d-1").run
    assert store.renew(run, "one", 60, now=clock.now()).cancel is None
    second = store.cancel_take(key, run, "two", 60, now=clock.now(), request="r-2")
    assert (second.acquired, second.replaced, second.cancelled) == (True, None, "one")
    again = store.cancel_take(key, run, "two", 60, now=clock.now(), request="r-2")
    assert (again.acquired, again.cancelled) == (True, "one")
    renewed = store.renew(run, "one", 60, now=clock.now())
    assert (renewed.held, renewed.cancel) == (True, "two")
    third = store.cancel_take(key, run, "three", 60, now=clock.now(), request="r-3")
    assert (third.acquired, third.replaced, third.cancelled) == (True, "two", None)
    assert store.renew(run, "one", 60, now=clock.now()).cancel == "three"
    # the run waits for the marker: the queued owner overlaps until it is released
    waiting = store.start_exclusive(key, run, "three", 60, now=clock.now(), delivery="d-3")
    assert (waiting.run, waiting.overlap, waiting.holder) == (False, True, "one")
    assert store.release(run, "one")
    started = store.start_exclusive(key, run, "three", 60, now=clock.now(), delivery="d-3")
    assert started.run
    assert store.renew(run, "three", 60, now=clock.now()).cancel is None


def test_undo_cancel_withdraws_the_request(store_name: str) -> None:
    """S7: a cancel dispatch whose reply was lost is undone: its lock is gone and the run
    it asked to stop reads no request any more; an undo of another owner's request leaves
    that request in place."""
    store, key = _store(store_name), jobs_flow.no_overlap.job_key((32,), {})
    run = running_key(key)
    _running(store, key, "one")
    assert store.cancel_take(key, run, "two", 60, now=clock.now(), request="r-2").cancelled \
        == "one"
    assert not store.undo_cancel(key, run, "other", "r-x")
    assert store.renew(run, "one", 60, now=clock.now()).cancel == "two"
    assert store.undo_cancel(key, run, "two", "r-2")
    assert store.get(key) is None
    assert store.renew(run, "one", 60, now=clock.now()).cancel is None


def test_a_queued_lock_without_a_run_is_replaced(store_name: str) -> None:
    """While the holder is queued (no run of the key), cancel_take acts as take_over."""
    store, key = _store(store_name), jobs_flow.no_overlap.job_key((33,), {})
    run = running_key(key)
    assert store.acquire(key, "one", 60, now=clock.now()).acquired
    answer = store.cancel_take(key, run, "two", 60, now=clock.now(), request="r-2")
    assert (answer.acquired, answer.replaced, answer.cancelled) == (True, "one", None)
    lock = store.get(key)
    assert lock is not None and (lock.owner, lock.state) == ("two", "queued")
