"""S7 on the Redis store: every script sent twice (a lost reply, the client's re-send) answers as
the first did and changes nothing more; a dispatch script run past its caller's deadline
changes nothing. The fault tests (tests/faults/) make the real server lose and delay replies;
these call the store's scripts twice on purpose, the way a re-send reaches the server."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import override_settings

from dedup_jobs import clock
from dedup_jobs.jobs import unique
from dedup_jobs.keys import build_key
from dedup_jobs.stores import get_store
from dedup_jobs.stores.base import CLAIMED, encode_call

pytestmark = [pytest.mark.redis, pytest.mark.django_db]

LOCK = build_key("unique", "tests.idempotent", "item=1")
BURST = build_key("debounce", "tests.idempotent", "item=1")


@pytest.fixture
def store(family_store: str) -> Any:
    """S1: the Redis store on each Redis-protocol backend (django-redis, Django's RedisCache,
    django-valkey on Valkey)."""
    with override_settings(DEDUP_JOBS={"STORE": family_store, "LEASE_SECONDS": 60}):
        yield get_store(family_store)


def debounce(store: Any, task_id: str, value: int) -> Any:
    return store.debounce(BURST, task_id, encode_call([value], {}), now=clock.now(),
                          debounce_for=0.01, max_wait=None, ttl=60.0)


def test_debounce_resent_by_the_burst_starter_still_publishes(store: Any) -> None:
    """S7/D1: the first dispatch's DEBOUNCE re-sent answers "new" again (the caller still
    publishes the burst's one message) and is not absorbed into its own burst."""
    first = debounce(store, "a", 1)
    again = debounce(store, "a", 1)
    assert (again.new, again.message_id, again.superseded) == (first.new, "a", None)
    assert store.get_debounce(BURST).count == 1


def test_debounce_resent_after_absorbing_answers_the_same(store: Any) -> None:
    """S7/D3: an absorbed dispatch re-sent, even after a later one, changes nothing: the
    latest stays the later one, each id is listed once, the same id is superseded."""
    debounce(store, "a", 1)
    first = debounce(store, "b", 2)
    debounce(store, "c", 3)
    again = debounce(store, "b", 2)
    assert (again.new, again.message_id, again.superseded) == (False, "a", "a") == (
        first.new, first.message_id, first.superseded)
    state = store.get_debounce(BURST)
    assert (state.count, state.latest_id, state.args) == (3, "c", (3,))
    due = store.claim_due(BURST, "a", now=clock.now() + 1)
    assert due.action == CLAIMED and due.absorbed == ("a", "b", "c")


def test_claim_resent_gets_the_same_latest_arguments_and_ids(store: Any) -> None:
    """S7/D4: a CLAIM re-sent by the message that claimed the burst gets the same latest
    arguments and absorbed ids (not "missing", which would run the first dispatch's)."""
    debounce(store, "a", 1)
    debounce(store, "b", 2)
    first = store.claim_due(BURST, "a", now=clock.now() + 1)
    again = store.claim_due(BURST, "a", now=clock.now() + 1)
    assert first.action == again.action == CLAIMED
    assert (again.latest_id, again.args, again.absorbed) == ("b", (2,), ("a", "b"))
    # the burst is over: the next dispatch starts a new one
    assert debounce(store, "d", 4).new


def test_debounce_resent_after_its_burst_ran_starts_nothing(store: Any) -> None:
    """S7/D5: a dispatch whose burst was claimed, re-sent late, is not a new burst."""
    debounce(store, "a", 1)
    debounce(store, "b", 2)
    assert store.claim_due(BURST, "a", now=clock.now() + 1).action == CLAIMED
    again = debounce(store, "b", 2)
    assert not again.new and again.message_id == "a"
    assert store.get_debounce(BURST) is None


def test_release_resent_answers_released(store: Any) -> None:
    """S7/U4: RELEASE re-sent (same request id) answers 1 again, by its tombstone; the same
    owner's release made again as a new request (the worker's re-send after a lost reply)
    answers 1 while the key is free, 0 once another owner took it; another owner's release
    answers 0, and a new owner's lock is never deleted."""
    assert store.acquire(LOCK, "a", 30, now=clock.now()).acquired
    args = ("a", "req-1", 5000)
    assert store._call_with_tombstone("RELEASE", LOCK, *args) == 1
    assert store._call_with_tombstone("RELEASE", LOCK, "a", "req-2", 5000) == 1
    assert store._call_with_tombstone("RELEASE", LOCK, "c", "req-3", 5000) == 0
    assert store.acquire(LOCK, "b", 30, now=clock.now()).acquired
    assert store._call_with_tombstone("RELEASE", LOCK, *args) == 1
    assert store._call_with_tombstone("RELEASE", LOCK, "a", "req-2", 5000) == 0
    assert store.get(LOCK).owner == "b"


def test_until_processing_start_resent_is_not_skipped(store: Any) -> None:
    """S7/P1: the until-processing START re-sent after a new dispatch took the freed lock
    still answers "released" (run), not "held by another owner" (skip)."""
    assert store.acquire(LOCK, "a", 30, now=clock.now()).acquired
    first = store.start(LOCK, "a", 30, now=clock.now(), release=True, delivery="d1")
    assert first.run and first.released
    assert store.acquire(LOCK, "b", 30, now=clock.now()).acquired
    again = store.start(LOCK, "a", 30, now=clock.now(), release=True, delivery="d1")
    assert again.run and again.released
    assert store.get(LOCK).owner == "b"


def test_acquire_past_its_deadline_changes_nothing(store: Any) -> None:
    """S7/U6: an ACQUIRE the server runs after its caller's deadline (the caller already
    raised StoreUnavailable) takes no lock."""
    late = int(clock.now() * 1000) - 1000
    answer = store._call("ACQUIRE", LOCK, "a", 30000, late, "0", LOCK.task_name, LOCK.ident)
    assert answer.decode().startswith("L")
    assert store.get(LOCK) is None


def test_debounce_past_its_deadline_changes_nothing(store: Any) -> None:
    """S7/D7: a DEBOUNCE run past its caller's deadline starts no burst."""
    late = int(clock.now() * 1000) - 1000
    keys = store._debounce_keys(BURST)
    answer = store._eval("DEBOUNCE", keys, ("a", encode_call([1], {}), int(clock.now() * 1000),
                                             10, "", 60000, BURST.task_name, BURST.ident, late))
    assert answer[0] == 2
    assert store.get_debounce(BURST) is None


def test_a_server_clock_ahead_costs_one_retry_then_none(store: Any, server_client: Any) -> None:
    """S7: a server whose clock runs ahead refuses the first acquire as late although its
    answer came in time; the store learns the skew, and the same call takes the lock."""
    store.skew_ms = -int((store.budget + 10) * 1000)  # as if the server were 10 s ahead
    assert store.acquire(LOCK, "a", 30, now=clock.now()).acquired
    assert store.skew_ms > -1000
    assert store.acquire(build_key("unique", "tests.idempotent", "item=2"), "b", 30,
                         now=clock.now()).acquired


# Found by tests/test_protocol_property.py (its minimal examples, run with
# DEDUP_JOBS_PROPERTY_STRICT=1 at the time), then fixed.


def test_until_processing_start_resent_after_the_lock_was_lost(
    store: Any, server_client: Any
) -> None:
    """S7/P1: a dispatch (until processing), its lock gone (FLUSHDB here; unique_for running
    out does the same), the START (release) whose reply is lost, a new dispatch takes the key,
    the START re-sent: it answers as the first did (run)."""
    assert store.acquire(LOCK, "a", 30, now=clock.now()).acquired
    server_client.flushdb()
    first = store.start(LOCK, "a", 30, now=clock.now(), release=True, delivery="d1")
    assert first.run and not first.released
    assert store.acquire(LOCK, "b", 30, now=clock.now()).acquired
    again = store.start(LOCK, "a", 30, now=clock.now(), release=True, delivery="d1")
    assert again == first


class _Results:
    """The result backend undo_lock writes to (its mark_as_revoked), as a dict."""

    ignore_result = False

    def __init__(self) -> None:
        self.backend = self
        self.states: dict[str, str] = {}

    def mark_as_revoked(self, task_id: str, reason: str = "", request: Any = None) -> None:
        self.states[task_id] = "REVOKED"


@pytest.mark.parametrize("loss", ["flush", "unique_for"])
def test_undo_of_a_lost_lock_still_revokes_its_id(
    store: Any, server_client: Any, monkeypatch: pytest.MonkeyPatch, loss: str
) -> None:
    """S7/U2: a dispatch whose acquire reply was lost (lock taken, nothing published), a second
    dispatch deduplicated onto its id, the lock lost, the store answers and the undo runs:
    the never-published id ends REVOKED, so the second caller's .get() returns."""
    undos: list[Any] = []

    class Recorder:
        def add(self, what: str, call: Any, *, store: object, lifetime: float,
                give_up: Any = None) -> None:
            undos.append(call)

    monkeypatch.setattr(unique, "rollbacks", Recorder())
    job = _Results()
    store.acquire(LOCK, "lost", 30, now=clock.now())  # its reply never arrives
    unique.undo_lock(job, store, LOCK, "lost", 30)  # type: ignore[arg-type]
    assert store.acquire(LOCK, "second", 30, now=clock.now()).holder == "lost"
    if loss == "flush":
        server_client.flushdb()
    else:
        server_client.delete(store.physical(LOCK.key))  # its unique_for ran out
    for undo in undos:
        undo()
    assert job.states.get("lost") == "REVOKED"
