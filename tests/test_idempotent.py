"""S7 on the Redis store, what only its scripts have: request ids and tombstones, the server's
clock. The fault tests (tests/faults/) make the real server lose and delay replies; these
call the store's scripts twice on purpose, the way a re-send reaches the server. The rules
every store keeps (a decision made again, a decision past its deadline) are in
tests/test_idempotent_stores.py, on the Redis family too."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import override_settings

from dedup_jobs import clock
from dedup_jobs.jobs import undo as undo_module
from dedup_jobs.jobs import unique
from dedup_jobs.keys import build_key
from dedup_jobs.stores import get_store
from dedup_jobs.stores.base import encode_call

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


def test_a_late_renewal_takes_nothing_back(store: Any) -> None:
    """S7/W6: a RENEW that lands past its caller's deadline (the run may have ended and
    released meanwhile) does not take the free key back; one in time does."""
    late = int(clock.now() * 1000) - 1000
    args = ("a", 30000, late, LOCK.task_name, LOCK.ident, "d1")
    assert store._call("RENEW", LOCK, *args).decode().startswith("L")
    assert store.get(LOCK) is None
    renewed = store.renew(LOCK, "a", 30, now=clock.now(), delivery="d1")
    assert renewed.held and renewed.retaken and store.get(LOCK).owner == "a"


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

    monkeypatch.setattr(undo_module, "rollbacks", Recorder())
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
