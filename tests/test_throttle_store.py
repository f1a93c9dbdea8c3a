"""The throttling decisions of the stores (T2-T4) on every store that can throttle (the Redis
family, Sentinel, the database store on SQLite, PostgreSQL and MariaDB, its row locks, the
plugin store): concurrency slots as leases, the rate's sliding window,
re-sends (S7), the store's own clock; and one round trip per admission on Redis."""

from __future__ import annotations

import itertools
import time
from typing import Any

import pytest
from django.test import override_settings

from dedup_jobs.exceptions import StoreUnavailable
from dedup_jobs.stores import get_store
from dedup_jobs.stores.base import RELEASED, BaseStore
from dedup_jobs.stores.protocols import missing
from dedup_jobs.stores.throttling import HELD_BACK, WAKE_AFTER
from tests import jobs_throttle
from tests.conftest import ALL_STORE_PARAMS, CANNOT_THROTTLE, DATABASE_STORE_PARAMS, store_fixture
from tests.fates_model import past_deadline
from tests.test_stores import delta

#: every store of the store-facing suites that can throttle (tests/conftest.py
#: ALL_STORE_PARAMS minus CANNOT_THROTTLE). The default run: django-redis, the database store
#: on SQLite and the plugin store; the slow store matrix (uv run pytest -m matrix) adds the
#: others (Django's RedisCache, django-valkey, Sentinel, PostgreSQL, MariaDB, the row locks)
DEFAULT_RUN = ("django-redis", "database-sqlite", "plugin-sharded")
store_name = store_fixture([
    p if p.id in DEFAULT_RUN
    else pytest.param(*p.values, marks=[*p.marks, pytest.mark.matrix], id=p.id)
    for p in ALL_STORE_PARAMS if p.values[0] not in CANNOT_THROTTLE
])


@pytest.mark.parametrize("store_name", CANNOT_THROTTLE, indirect=True)
def test_the_stores_left_out_cannot_throttle(store_name: str) -> None:
    """The list above leaves out only stores that lack the throttle capability: one that
    gains it fails here, until it joins the list."""
    cls = type(_store(store_name))
    assert not cls.can_throttle and missing(cls, "throttle"), cls


def _store(store_name: str) -> BaseStore:
    return get_store("database" if store_name.startswith("database") else store_name)


def admit(store: BaseStore, key: Any, owner: str, delivery: str = "", *, n: int = 0,
          k: int = 0, period: float = 1.0, lease: float = 60) -> Any:
    return store.throttle_admit(key, owner, delivery=delivery or f"d-{owner}", concurrency=n,
                                rate_limit=k, rate_period=period, lease=lease)


def test_concurrency_slots(store_name: str) -> None:
    """T2/S7: two slots: two owners admitted, the third deferred ("concurrency", until at most
    LEASE/3 away); the holder's retry (same owner) is admitted and takes no second slot; once
    a slot is released the waiter is admitted; another throttle key is not held back."""
    store = _store(store_name)
    key = jobs_throttle.two_at_once.throttle_key((1,), {})
    assert admit(store, key, "a", n=2).admitted and admit(store, key, "b", n=2).admitted
    third = admit(store, key, "c", n=2)
    assert (third.admitted, third.reason) == (False, "concurrency")
    assert time.time() < third.until <= time.time() + 60 / 3 + 0.5
    assert admit(store, key, "b", "retry-of-b", n=2).admitted  # a retry keeps its slot
    assert not admit(store, key, "c", n=2).admitted
    other = jobs_throttle.two_at_once.throttle_key((2,), {})
    assert admit(store, other, "x", n=2).admitted
    assert store.throttle_release(key, "a")
    _sleep_until(third.until)  # back for its turn
    assert admit(store, key, "c", n=2).admitted
    assert not admit(store, key, "d", n=2).admitted


def test_a_release_that_can_wake_calls_the_earliest_waiter(store_name: str) -> None:
    """T2, the wake (docs/throttling.md#wake), on every store: a store that can wake
    (``can_wake``) frees the slot and, in the same call, calls the waiter of the earliest
    turn seconds away (a run of 0.6 s measured: turns ~1.45 s apart where waiters are woken),
    moving its turn to now: it is admitted at once, ahead of the plan (a second waiter's
    turn after it); the call re-sent (its reply lost, S7)
    answers freed and calls nobody again. A store that cannot wake has no such call (the
    engine then releases the plain way)."""
    store = _store(store_name)
    if not getattr(store, "can_wake", False):
        assert not hasattr(store, "throttle_release_waking"), store_name
        return
    key = jobs_throttle.one_at_once.throttle_key((), {})
    wakes = {"wakes": True}
    assert store.throttle_admit(key, "w", delivery="d-w", concurrency=1, rate_limit=0,
                                rate_period=1.0, lease=60, **wakes).admitted
    time.sleep(0.6)  # a run of 0.6 s: the key's measured average
    assert store.throttle_release(key, "w")
    assert store.throttle_admit(key, "a", delivery="d-a", concurrency=1, rate_limit=0,
                                rate_period=1.0, lease=60, **wakes).admitted
    waiter = store.throttle_admit(key, "b", delivery="d-b", concurrency=1, rate_limit=0,
                                  rate_period=1.0, lease=60, **wakes)
    assert (waiter.admitted, waiter.reason) == (False, "concurrency")
    assert waiter.until - time.time() > 1.0  # 2 x (1.2 x 600 ms + 5 ms), less the time since
    # a second waiter, planned after b: without the move, b back early would leave the slot
    # to the plan (deferred again)
    assert not store.throttle_admit(key, "c", delivery="d-c", concurrency=1, rate_limit=0,
                                    rate_period=1.0, lease=60, **wakes).admitted
    released = store.throttle_release_waking(key, "a", WAKE_AFTER)
    assert (bool(released), released.wake) == (True, "b")
    assert store.throttle_admit(key, "b", delivery="d-b2", concurrency=1, rate_limit=0,
                                rate_period=1.0, lease=60, **wakes).admitted
    again = store.throttle_release_waking(key, "a", WAKE_AFTER)
    assert (bool(again), again.wake) == (True, None)


def test_slot_is_a_lease(store_name: str) -> None:
    """T2: a slot nobody renews (its worker was SIGKILLed) frees after its lease; a renewed
    one does not; a released slot with nobody waiting is free; a lapsed slot is taken back
    by its renewal while there is room."""
    store = _store(store_name)
    key = jobs_throttle.two_at_once.throttle_key((3,), {})
    assert admit(store, key, "dead", n=1, lease=1.0).admitted
    assert not admit(store, key, "next", n=1, lease=1.0).admitted
    time.sleep(1.3)
    assert admit(store, key, "next", n=1, lease=1.0).admitted
    for _ in range(3):
        time.sleep(0.3)
        assert store.throttle_renew(key, "next", 1.0, limit=1).held
    assert not admit(store, key, "other", n=1, lease=1.0).admitted
    assert store.throttle_release(key, "next")
    time.sleep(1.3)  # the lease of "other"'s wait is over too; nothing holds the slot
    assert admit(store, key, "lapsed", n=1, lease=1.0).admitted
    time.sleep(1.3)  # "lapsed" was never renewed: its slot is free to take back
    renewed = store.throttle_renew(key, "lapsed", 1.0, limit=1)
    assert renewed.held and renewed.retaken


def _measured(store: BaseStore, key: Any) -> None:
    """One run of ``key`` measured (a few ms): its waiters' turns are short."""
    assert admit(store, key, "warm", n=1).admitted
    assert store.throttle_release(key, "warm")


def _sleep_until(at: float) -> None:
    time.sleep(max(0.0, at - time.time()) + 0.01)


def test_waiter_back_for_its_turn_takes_any_free_slot(store_name: str) -> None:
    """T2: a released slot is held for no one: a waiter back for its turn takes any free
    slot (one back later than it is planned again), and a newcomer does not take a slot a
    waiter's turn is planned on."""
    store = _store(store_name)
    key = jobs_throttle.two_at_once.throttle_key((7,), {})
    _measured(store, key)
    assert admit(store, key, "a", n=1).admitted
    first, second = admit(store, key, "b", n=1), admit(store, key, "c", n=1)
    assert not first.admitted and not second.admitted and first.until < second.until
    assert store.throttle_release(key, "a")
    newcomer = admit(store, key, "x", n=1)
    assert (newcomer.admitted, newcomer.reason) == (False, "concurrency")
    assert newcomer.until > second.until  # planned after the turns before it
    _sleep_until(second.until)
    assert admit(store, key, "c", n=1).admitted  # back for its turn, before "b": runs
    late = admit(store, key, "b", n=1)
    assert (late.admitted, late.reason) == (False, "concurrency")  # planned again


def test_waiters_missing_their_turns(store_name: str) -> None:
    """T2: a waiter not back a step after its turn is held back by the broker (behind a
    burst of newer messages): meanwhile a newcomer takes a free slot at once (it would
    idle), and one deferred is planned at least HELD_BACK x that lateness from now, to come
    back after the burst rather than in it."""
    store = _store(store_name)
    key = jobs_throttle.two_at_once.throttle_key((8,), {})
    _measured(store, key)
    assert admit(store, key, "a", n=1).admitted
    held = admit(store, key, "b", n=1)
    assert not held.admitted
    _sleep_until(held.until + 0.3)
    asked, late = time.time(), time.time() - held.until
    during = admit(store, key, "c", n=1)  # "a" still runs: planned after the burst
    assert not during.admitted and during.until - asked >= HELD_BACK * late * 0.9
    assert store.throttle_release(key, "a")
    assert admit(store, key, "d", n=1).admitted  # a free slot while "b" misses its turn
    assert not admit(store, key, "b", n=1).admitted  # back at last: planned again


def test_rate_sliding_window(store_name: str) -> None:
    """T3/S7: "3/s": three starts admitted, the next ones deferred ("throttle") to reserved
    start times spread one period apart per three; a re-send of an admitted start (same
    delivery) is admitted again without counting twice; a reserved message that comes back
    at its time is admitted."""
    store = _store(store_name)
    key = jobs_throttle.five_per_second.throttle_key((), {})
    began = time.time()
    assert admit(store, key, "s0", k=3).admitted
    answered = time.time()  # the first start was made between began and answered
    assert all(admit(store, key, f"s{i}", k=3).admitted for i in (1, 2))
    assert admit(store, key, "s0", k=3).admitted  # the same delivery again (S7)
    later = [admit(store, key, f"w{i}", k=3) for i in range(4)]
    assert {a.reason for a in later} == {"throttle"} and not any(a.admitted for a in later)
    waits = [a.until - began for a in later]
    # one period after the first start they wait out (measured from either side of that
    # call: a slow first call, such as a cluster's first, moves both), paced a third of a
    # second apart
    assert waits[0] > 0.95 and later[0].until - answered < 1.3, (waits, answered - began)
    assert waits[3] - waits[0] >= 1.0, waits
    assert all(b - a >= 0.3 for a, b in itertools.pairwise(waits)), waits
    again = admit(store, key, "w3", k=3)
    assert abs(again.until - later[3].until) < 0.1  # its reservation, not a new one
    time.sleep(max(0.0, later[0].until - time.time()) + 0.02)
    assert admit(store, key, "w0", k=3).admitted


def test_concurrency_and_rate_together(store_name: str) -> None:
    """T2+T3: a message must pass both limits; a message held back by the rate takes no
    slot."""
    store = _store(store_name)
    key = jobs_throttle.two_at_once.throttle_key((4,), {})
    assert admit(store, key, "a", n=2, k=1).admitted
    by_rate = admit(store, key, "b", n=2, k=1)
    assert (by_rate.admitted, by_rate.reason) == (False, "throttle")
    assert admit(store, key, "c", n=2, k=1).reason == "throttle"
    assert store.throttle_release(key, "a")
    assert not store.throttle_release(key, "b")


@pytest.mark.parametrize("store_name", DATABASE_STORE_PARAMS, indirect=True)
def test_database_expiry_is_the_servers_clock(store_name: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """T2/S3: with the client's clock an hour ahead a slot still holds (the server's clock
    decides)."""
    from tests.test_database_clock import HOUR, skew

    store = _store(store_name)
    key = jobs_throttle.two_at_once.throttle_key((5,), {})
    assert admit(store, key, "a", n=1).admitted
    skew(monkeypatch, HOUR)
    assert admit(store, key, "b", n=1).reason == "concurrency"


@pytest.mark.redis
@override_settings(DEDUP_JOBS={"STORE": "redis"})
def test_redis_admission_is_one_round_trip(redis_client: Any) -> None:
    """T4 / section 8, counted on the Redis server (MONITOR): an admission is one EVALSHA,
    admitted or deferred; a slot's release one more; a slot's renewal one."""
    store = get_store("redis")
    key = jobs_throttle.two_at_once.throttle_key((6,), {})
    admit(store, key, "warm", n=1, k=10)
    store.throttle_release(key, "warm")
    store.throttle_renew(key, "warm", 1, limit=1)
    store.throttle_release(key, "warm")
    assert delta(redis_client, lambda: admit(store, key, "a", n=1, k=10)) == {"evalsha": 1}
    assert delta(redis_client, lambda: admit(store, key, "b", n=1, k=10)) == {"evalsha": 1}
    assert delta(redis_client, lambda: store.throttle_renew(key, "a", 60, limit=1)) == {
        "evalsha": 1}
    assert delta(redis_client, lambda: store.throttle_release(key, "a")) == {"evalsha": 1}


def _running(store: BaseStore, key: Any) -> int:
    """The concurrency slots held at ``key`` (the admin's count, T5)."""
    page = store.throttle_page(offset=0, limit=100, task_name=key.task_name, now=time.time())
    return sum(item.running for item in page.items if item.key == key.key)


def test_resent_release_answers_as_the_first(store_name: str) -> None:
    """S7 (issue 21, case 8): a release whose reply was lost is sent again: the re-send
    answers as the first did (freed), while a release of a slot never held answers not."""
    store = _store(store_name)
    key = jobs_throttle.two_at_once.throttle_key((9,), {})
    assert admit(store, key, "a", n=2).admitted
    assert store.throttle_release(key, "a")
    assert store.throttle_release(key, "a")  # the re-send: the same answer
    assert not store.throttle_release(key, "never-held")


def test_late_renewal_never_takes_a_released_slot_back(store_name: str) -> None:
    """T4 (issue 21, case 6): a renewal that reaches the store after its run released the
    slot (sent before the release, executed after it) changes nothing: the slot stays free."""
    store = _store(store_name)
    key = jobs_throttle.two_at_once.throttle_key((10,), {})
    assert admit(store, key, "a", n=1).admitted
    assert store.throttle_release(key, "a")
    late = store.throttle_renew(key, "a", 60, limit=1)
    assert not late.held
    assert _running(store, key) == 0
    assert admit(store, key, "b", n=1).admitted


def test_late_admission_takes_no_slot(store_name: str) -> None:
    """T2/S7 (issue 21, the database store): an admission that reaches the store after its
    caller gave up (the worker deferred the message, W7, and its copy ran and released since)
    changes nothing: no slot is left for a run that is not running."""
    store = _store(store_name)
    key = jobs_throttle.two_at_once.throttle_key((12,), {})
    with past_deadline(store), pytest.raises(StoreUnavailable):
        admit(store, key, "g1", "n1", n=1)
    assert _running(store, key) == 0
    assert admit(store, key, "g2", n=1).admitted


def test_admission_resent_after_its_task_was_admitted_again(store_name: str) -> None:
    """T2/W7 (issue 21, case 4): g1's admission took a slot but its reply was lost, so g1
    was deferred; the copy of g1 that comes back is admitted into that slot (a new nonce).
    The first admission sent again (or late) then changes nothing and grants nothing
    (RELEASED): nothing of it to release, the copy keeps its slot, the limit holds; after the
    copy released its slot neither admission of g1 takes it back."""
    store = _store(store_name)
    key = jobs_throttle.two_at_once.throttle_key((11,), {})
    assert admit(store, key, "g1", "n1", n=2).admitted  # the reply lost: deferred (W7)
    assert admit(store, key, "g1", "n2", n=2).admitted  # the copy, back: runs
    stale = admit(store, key, "g1", "n1", n=2)  # the first admission, re-sent
    assert (stale.admitted, stale.reason) == (False, RELEASED)
    assert admit(store, key, "g2", n=2).admitted
    assert _running(store, key) == 2
    assert not admit(store, key, "g3", n=2).admitted  # g1's copy and g2 run
    assert store.throttle_release(key, "g1")
    for nonce in ("n1", "n2"):  # late deliveries of either admission of g1
        late = admit(store, key, "g1", nonce, n=2)
        assert (late.admitted, late.reason) == (False, RELEASED)
    assert _running(store, key) == 1


def test_admission_of_a_slot_its_task_holds_already_says_so(store_name: str) -> None:
    """W5/T2: a second delivery of g1 (a new nonce) admitted while g1's first run holds its
    slot is told so (``held``): a copy put off by W5 then leaves the slot to that run rather
    than releasing it (the run would go on outside the limit). A message admitted once is
    not ``held``."""
    store = _store(store_name)
    key = jobs_throttle.two_at_once.throttle_key((12,), {})
    first = admit(store, key, "g1", "n1", n=1)
    assert (first.admitted, first.held) == (True, False)
    copy = admit(store, key, "g1", "n2", n=1)  # the copy, while the first run holds the slot
    assert (copy.admitted, copy.held) == (True, True)
    assert _running(store, key) == 1
    assert not admit(store, key, "g2", n=1).admitted  # still one run at once
    assert store.throttle_release(key, "g1")
    assert _running(store, key) == 0
