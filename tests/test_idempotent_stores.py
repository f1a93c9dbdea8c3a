"""S7 on every store (the Redis family, locmem, memcached, the database store on SQLite,
PostgreSQL and MariaDB): a decision made twice (a lost reply, the client's re-send) answers
as the first did and changes nothing more; a dispatch decision that reaches the store past
its caller's deadline changes nothing. The re-send is the same call made again, and "late"
is a deadline (``deadline_ms``) already past. tests/test_idempotent.py adds what only the
Redis scripts have: request ids and tombstones, the server's clock."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.core.cache import caches

from dedup_jobs import clock
from dedup_jobs.exceptions import StoreUnavailable
from dedup_jobs.keys import build_key
from dedup_jobs.stores import get_store
from dedup_jobs.stores.base import CLAIMED, BaseStore, encode_call
from dedup_jobs.stores.database import statements
from tests.conftest import ALL_STORE_PARAMS, store_fixture

pytestmark = pytest.mark.django_db(databases="__all__")

store_name = store_fixture([
    *ALL_STORE_PARAMS,
    # the row-locking path on SQLite too (portable.py; ALL_STORE_PARAMS has it on PostgreSQL)
    pytest.param("database", id="database-sqlite-portable"),
])

LOCK = build_key("unique", "tests.idempotent_stores", "item=1")
BURST = build_key("debounce", "tests.idempotent_stores", "item=1")


@pytest.fixture
def store(store_name: str, request: pytest.FixtureRequest,
          monkeypatch: pytest.MonkeyPatch) -> Iterator[BaseStore]:
    caches["locmem"].clear()
    if "-portable" in request.node.callspec.id:
        monkeypatch.setattr(statements, "dialect", lambda connection: None)
    yield get_store("database" if store_name.startswith("database") else store_name)


def no_dispatch_record_on_the_database(request: pytest.FixtureRequest, store_name: str) -> None:
    """Known gap (issue 21): the database store keeps a claim record per message (a claim made
    again answers as the first did), but no record per dispatch, so a dispatch made again
    after its burst was claimed starts a new burst. Strict: fixed, it fails."""
    if store_name.startswith("database"):
        request.applymarker(pytest.mark.xfail(
            strict=True, reason="issue 21: no per-dispatch record on the database store yet"))


def debounce(store: BaseStore, task_id: str, value: int) -> Any:
    return store.debounce(BURST, task_id, encode_call([value], {}), now=clock.now(),
                          debounce_for=0.01, max_wait=None, ttl=60.0)


#: how a store says the call came too late: its own check of the deadline (``past its
#: caller's deadline``), or the Redis scripts' refusal on the server's clock
LATE = r"past its caller's deadline|refused the [\w-]+ as late"


def past_deadline(store: BaseStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """The caller gave up a second ago (STORE_TIMEOUT passed before the call got through)."""
    monkeypatch.setattr(store, "deadline_ms", lambda: int(clock.now() * 1000) - 1000)


def test_acquire_past_its_deadline_changes_nothing(
    store: BaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """S7/U6: an acquire that reaches the store after its caller's deadline (the caller raised
    StoreUnavailable and undid it already) takes no lock: no orphan lock for unique_for."""
    past_deadline(store, monkeypatch)
    with pytest.raises(StoreUnavailable, match=LATE):
        store.acquire(LOCK, "a", 30, now=clock.now(), request="a")
    assert store.get(LOCK) is None


def test_take_over_past_its_deadline_changes_nothing(
    store: BaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """S7/R1: a late take-over neither takes the key nor replaces its queued holder."""
    assert store.acquire(LOCK, "a", 30, now=clock.now()).acquired
    past_deadline(store, monkeypatch)
    with pytest.raises(StoreUnavailable, match=LATE):
        store.take_over(LOCK, "b", 30, now=clock.now(), request="b")
    assert store.get(LOCK).owner == "a"  # type: ignore[union-attr]


def test_debounce_past_its_deadline_changes_nothing(
    store: BaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """S7/D7: a late debounce starts no burst (whose message would never be published)."""
    past_deadline(store, monkeypatch)
    with pytest.raises(StoreUnavailable, match=LATE):
        debounce(store, "a", 1)
    assert store.get_debounce(BURST) is None


def test_late_renewal_takes_no_lock_back(
    store: BaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """S7/W6: a renewal that reaches the store after its caller gave up (its run may have
    ended and released since) does not take the freed key back; in time it does."""
    assert store.start(LOCK, "r1", 30, now=clock.now(), release=False, delivery="n1").took
    assert store.release(LOCK, "r1")
    with monkeypatch.context() as late:
        past_deadline(store, late)
        with pytest.raises(StoreUnavailable, match=LATE):
            store.renew(LOCK, "r1", 30, now=clock.now(), delivery="n1")
    assert store.get(LOCK) is None
    assert store.renew(LOCK, "r1", 30, now=clock.now(), delivery="n1").retaken


def test_release_resent_answers_released(store: BaseStore) -> None:
    """S7/U4: a release made again (its reply lost) answers True, as the first did; another
    owner's lock is never deleted by it."""
    assert store.acquire(LOCK, "a", 30, now=clock.now()).acquired
    assert store.release(LOCK, "a")
    assert store.release(LOCK, "a")
    assert store.acquire(LOCK, "b", 30, now=clock.now()).acquired
    store.release(LOCK, "a")
    assert store.get(LOCK).owner == "b"  # type: ignore[union-attr]
    assert not store.release(LOCK, "c")


def test_debounce_resent_by_the_burst_starter_still_publishes(store: BaseStore) -> None:
    """S7/D1: the first dispatch made again answers "new" (the caller still publishes the
    burst's one message) and is not absorbed into its own burst."""
    first = debounce(store, "a", 1)
    again = debounce(store, "a", 1)
    assert (again.new, again.message_id, again.superseded) == (first.new, "a", None)
    assert store.get_debounce(BURST).count == 1  # type: ignore[union-attr]


def test_debounce_resent_after_absorbing_answers_the_same(store: BaseStore) -> None:
    """S7/D3: an absorbed dispatch made again, even after a later one, changes nothing."""
    debounce(store, "a", 1)
    first = debounce(store, "b", 2)
    debounce(store, "c", 3)
    again = debounce(store, "b", 2)
    assert (again.new, again.message_id, again.superseded) == (False, "a", "a") == (
        first.new, first.message_id, first.superseded)
    state = store.get_debounce(BURST)
    assert state is not None and (state.count, state.latest_id, state.args) == (3, "c", (3,))
    due = store.claim_due(BURST, "a", now=clock.now() + 1)
    assert due.action == CLAIMED and due.absorbed == ("a", "b", "c")


def test_claim_resent_gets_the_same_latest_arguments_and_ids(store: BaseStore) -> None:
    """S7/D4: a claim made again by the message that claimed the burst gets the same latest
    arguments and ids (not "missing", which runs the first dispatch's and leaves the others'
    results never ready)."""
    debounce(store, "a", 1)
    debounce(store, "b", 2)
    first = store.claim_due(BURST, "a", now=clock.now() + 1)
    again = store.claim_due(BURST, "a", now=clock.now() + 1)
    assert first.action == again.action == CLAIMED
    assert (again.latest_id, again.args, again.absorbed) == ("b", (2,), ("a", "b"))
    assert debounce(store, "d", 4).new  # the burst is over: the next dispatch starts one


def test_debounce_resent_after_its_burst_ran_starts_nothing(
    store: BaseStore, request: pytest.FixtureRequest, store_name: str
) -> None:
    """S7/D5: a dispatch whose burst was claimed, made again late, is not a new burst."""
    no_dispatch_record_on_the_database(request, store_name)
    debounce(store, "a", 1)
    debounce(store, "b", 2)
    assert store.claim_due(BURST, "a", now=clock.now() + 1).action == CLAIMED
    again = debounce(store, "b", 2)
    assert not again.new and again.message_id == "a"
    assert store.get_debounce(BURST) is None


def test_acquire_resent_with_an_explicit_id_answers_taken(store: BaseStore) -> None:
    """S7/U2: the acquire of an explicit task id made again (same request) answers "taken",
    so the id is published, not deduplicated onto itself; another dispatch of the same id (a
    new request) is a duplicate."""
    assert store.acquire(LOCK, "x", 30, now=clock.now(), request="r1").acquired
    again = store.acquire(LOCK, "x", 30, now=clock.now(), request="r1")
    assert again.acquired and again.holder == "x"
    other = store.acquire(LOCK, "x", 30, now=clock.now(), request="r2")
    assert not other.acquired and other.holder == "x"


def test_claim_resent_after_a_later_burst_was_claimed(store: BaseStore) -> None:
    """D4/S7: a claim made again by its message (its reply was lost, the message tried again)
    after a later burst of the key was claimed (by its own message, or by the undo of a
    failed dispatch) gets its own answer back, with every absorbed id, not "missing" (which
    runs the message alone and leaves the ids it absorbed waiting forever)."""
    debounce(store, "d1", 1)
    debounce(store, "d2", 2)
    first = store.claim_due(BURST, "d1", now=clock.now() + 1)
    assert first.action == CLAIMED and first.absorbed == ("d1", "d2")
    assert debounce(store, "d3", 3).new
    later = store.claim_due(BURST, "d3", now=clock.now() + 100)  # the undo's claim
    assert later.action == CLAIMED and later.absorbed == ("d3",)
    again = store.claim_due(BURST, "d1", now=clock.now() + 1)
    assert (again.action, again.latest_id, again.args, again.absorbed) == (
        CLAIMED, "d2", (2,), ("d1", "d2"))
    # and the later claim's re-send still answers as it did
    assert store.claim_due(BURST, "d3", now=clock.now() + 100).absorbed == ("d3",)


def test_undo_of_chained_take_overs_gives_the_lock_back_to_the_first_holder(
    store: BaseStore,
) -> None:
    """S7/R1: a queued holder replaced by a take-over whose reply was lost, that one replaced
    in turn by another whose reply was lost too: the replaced holder's check waits (it was
    taken over, not skipped), and once both undos ran, in either order, the lock is the first
    holder's again, never one of the failed dispatches'."""
    for first_undone in ("g2", "g3"):
        store.release(LOCK, "g1")
        assert store.acquire(LOCK, "g1", 30, now=clock.now(), request="r1").acquired
        assert store.take_over(LOCK, "g2", 30, now=clock.now(), request="r2").replaced == "g1"
        assert store.take_over(LOCK, "g3", 30, now=clock.now(), request="r3").replaced == "g2"
        check = store.start(LOCK, "g1", 30, now=clock.now(), release=False, delivery="n1")
        assert not check.run and check.taken_over is not None, check
        order = ("g2", "g3") if first_undone == "g2" else ("g3", "g2")
        for owner in order:
            assert store.undo(LOCK, owner, f"r{owner[1]}"), owner
        lock = store.get(LOCK)
        assert lock is not None and (lock.owner, lock.state) == ("g1", "queued"), lock


def test_a_take_over_keeps_the_16_newest_holders_it_replaced(store: BaseStore) -> None:
    """S7/R1, cost: a replace storm keeps at most 16 replaced holders in the lock (each
    take-over stays one small write): undone newest first, 20 take-overs give the lock back
    down to the 16th holder before the last; the undo past them frees the key."""
    assert store.acquire(LOCK, "g0", 30, now=clock.now(), request="r0").acquired
    for n in range(1, 21):
        assert store.take_over(LOCK, f"g{n}", 30, now=clock.now(), request=f"r{n}").acquired
    for n in range(20, 4, -1):
        assert store.undo(LOCK, f"g{n}", f"r{n}")
        assert store.get(LOCK).owner == f"g{n - 1}"  # type: ignore[union-attr]
    assert store.undo(LOCK, "g4", "r4")
    assert store.get(LOCK) is None


def test_undo_made_again_answers_as_the_first(store: BaseStore) -> None:
    """S7/U2: an undo whose reply was lost, made again, answers True as the first did (the
    caller marks an explicit id REVOKED only on True: a dispatch deduplicated onto it meanwhile
    must not wait forever); another request's undo answers False and leaves the lock."""
    assert store.acquire(LOCK, "e1", 30, now=clock.now(), request="r1").acquired
    assert not store.undo(LOCK, "e1", "other-request")
    assert store.get(LOCK).owner == "e1"  # type: ignore[union-attr]
    assert store.undo(LOCK, "e1", "r1")
    assert store.undo(LOCK, "e1", "r1")
    assert store.get(LOCK) is None
