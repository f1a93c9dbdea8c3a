"""The indexes of the Redis family (held locks, pending debounces, throttle keys) are trimmed
of entries whose keys expired, by the scripts that already run, and never more than
INDEX_TRIM at a time: a backlog of keys that expired together (a million locks whose jobs
never ran, a burst of debounces nobody claimed) is cleared over the decisions that follow,
never by one of them alone, which would stall the server for the whole backlog. The
operator's trim (clear_stale_locks) goes in bounded calls too."""

from __future__ import annotations

import itertools
from typing import Any

from dedup_jobs import clock
from dedup_jobs.keys import build_key
from dedup_jobs.stores import get_store
from dedup_jobs.stores.base import encode_call
from dedup_jobs.stores.redis.scripts import TRIM_BATCH
from dedup_jobs.stores.redis.trim import INDEX_TRIM
from tests import jobs, jobs_throttle
from tests.test_stores import delta


def _server_ms(redis_client: Any) -> int:
    seconds, micros = redis_client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def _backlog(redis_client: Any, index: str, count: int, score: int) -> None:
    """``count`` entries of keys long gone, all scored ``score``, added to ``index``."""
    for chunk in range(0, count, 10_000):
        redis_client.zadd(index, {f"gone:{n}": score
                                  for n in range(chunk, min(count, chunk + 10_000))})


def _expired_entries(redis_client: Any, store: Any) -> int:
    seconds, micros = redis_client.time()
    now_ms = seconds * 1000 + micros // 1000
    return int(redis_client.zcount(store.index_key(), "-inf", f"({now_ms}"))


def test_lock_index_entries_of_expired_locks_are_trimmed(
    family_store: str, server_client: Any
) -> None:
    """S1: locks that expired without a release leave the index: every release trims it,
    and acquires do now and then (about one in 16), so it stays bounded either way."""
    import time

    redis_client = server_client
    store = get_store(family_store)
    for n in range(20):
        store.acquire(jobs.unique_sleep.job_key((f"short-{n}",), {}), f"o{n}", 0.001,
                      now=clock.now())
    time.sleep(0.05)
    assert _expired_entries(redis_client, store) > 0  # acquires rarely trim (1 in 16)
    key = jobs.unique_sleep.job_key(("released",), {})
    store.acquire(key, "mine", 60, now=clock.now())
    assert store.release(key, "mine")
    assert _expired_entries(redis_client, store) == 0
    # with no release at all, acquires trim too
    for n in range(20):
        store.acquire(jobs.unique_sleep.job_key((f"again-{n}",), {}), f"a{n}", 0.001,
                      now=clock.now())
    time.sleep(0.05)
    for n in range(400):
        store.acquire(jobs.unique_sleep.job_key((f"long-{n}",), {}), f"l{n}", 60,
                      now=clock.now())
        if _expired_entries(redis_client, store) == 0:
            break
    assert _expired_entries(redis_client, store) == 0


def test_lock_index_trim_is_bounded_per_decision(
    family_store: str, server_client: Any
) -> None:
    """S1, section 8: a decision trims at most INDEX_TRIM expired index entries, so a
    backlog (a million locks that expired together, their jobs never run) never stalls
    one release or acquire for the whole backlog; the decisions that follow clear it."""
    redis_client = server_client
    store = get_store(family_store)
    seconds, _micros = redis_client.time()
    past = (int(seconds) - 60) * 1000
    backlog = 2 * INDEX_TRIM + 50
    redis_client.zadd(store.index_key(), {f"gone:{n}": past for n in range(backlog)})
    key = jobs.unique_sleep.job_key(("bounded",), {})
    store.acquire(key, "mine", 60, now=clock.now())
    left = _expired_entries(redis_client, store)
    assert left >= backlog - INDEX_TRIM  # the acquire trimmed no more than INDEX_TRIM
    assert store.release(key, "mine")
    assert _expired_entries(redis_client, store) == left - INDEX_TRIM
    for n in range(3):
        store.acquire(key, f"again-{n}", 60, now=clock.now())
        store.release(key, f"again-{n}")
    assert _expired_entries(redis_client, store) == 0



def _drops(redis_client: Any, index: str, past: int, backlog: int,
           call: Any) -> tuple[list[int], int]:
    """Make calls ``call(n)`` until the backlog of entries scored ``past`` is gone (or 3,000
    calls): how many entries each call that trimmed dropped, and the number of calls."""
    drops = []
    left = backlog
    for n in itertools.count():
        call(n)
        now_left = int(redis_client.zcount(index, past, past))
        if now_left != left:
            drops.append(left - now_left)
            left = now_left
        if left == 0 or n == 3000:
            return drops, n + 1
    raise AssertionError("unreachable")


def test_debounce_index_trim_is_bounded_per_dispatch(
    family_store: str, server_client: Any
) -> None:
    """D1, section 8: a debounced dispatch trims the debounce index now and then (about one
    in 16), at most INDEX_TRIM entries of bursts gone; the dispatches that follow clear a
    backlog, and the live bursts' own entries stay."""
    redis_client = server_client
    store = get_store(family_store)
    index = store.debounce_index_key()
    past = _server_ms(redis_client) - 3_600_000  # gone longer than any ttl below
    backlog = 2 * INDEX_TRIM + 50
    _backlog(redis_client, index, backlog, past)

    def dispatch(n: int) -> None:
        store.debounce(build_key("debounce", "tests.debounce_record", f"trim={n}"), f"m-{n}",
                       encode_call((n,), {}), now=clock.now(), debounce_for=600,
                       max_wait=None, ttl=600)

    drops, calls = _drops(redis_client, index, past, backlog, dispatch)
    assert drops == [INDEX_TRIM, INDEX_TRIM, backlog - 2 * INDEX_TRIM]
    assert redis_client.zcard(index) == calls  # every dispatch's own burst entry stays


def test_throttle_index_trim_is_bounded_per_admission(
    family_store: str, server_client: Any
) -> None:
    """T4, section 8: an admission trims the throttle index now and then (about one in 16),
    at most INDEX_TRIM entries of throttle keys gone; admissions clear a backlog."""
    redis_client = server_client
    store = get_store(family_store)
    index = store.throttle_index_key()
    past = _server_ms(redis_client) - 3_600_000
    backlog = 2 * INDEX_TRIM + 50
    _backlog(redis_client, index, backlog, past)

    def admit(n: int) -> None:
        key = jobs_throttle.two_at_once.throttle_key((f"trim-{n}",), {})
        assert store.throttle_admit(key, f"o{n}", delivery=f"d{n}", concurrency=2,
                                    rate_limit=0, rate_period=1.0, lease=60).admitted

    drops, _calls = _drops(redis_client, index, past, backlog, admit)
    assert drops == [INDEX_TRIM, INDEX_TRIM, backlog - 2 * INDEX_TRIM]


def test_operators_trim_goes_in_bounded_calls(family_store: str, server_client: Any) -> None:
    """clear_stale_locks' index trim (RedisListing.trim_index) drops every expired entry, in
    calls of at most TRIM_BATCH each (one EVALSHA of TRIM_INDEX a batch, seen with MONITOR;
    nothing else but a new connection's SELECT / CLIENT SETINFO); a held lock's entry
    stays."""
    redis_client = server_client
    store = get_store(family_store)
    key = jobs.unique_sleep.job_key(("held",), {})
    assert store.acquire(key, "mine", 60, now=clock.now()).acquired
    store.trim_index()  # the script loaded (another test may have run SCRIPT FLUSH)
    _backlog(redis_client, store.index_key(), 2 * TRIM_BATCH + 500,
             _server_ms(redis_client) - 60_000)
    removed: list[int] = []
    calls = delta(redis_client, lambda: removed.append(store.trim_index()))
    calls.pop("select", None)  # a new connection's set-up, if one was opened
    calls.pop("client", None)
    assert calls == {"evalsha": 3}
    assert removed == [2 * TRIM_BATCH + 500]
    assert redis_client.zrange(store.index_key(), 0, -1) == [store.place(key)[0].encode()]


def test_debounce_page_leaves_out_entries_of_bursts_gone(
    family_store: str, server_client: Any
) -> None:
    """A1 on the Redis family: the Debounced jobs page counts and lists only bursts whose
    state can still be there (due less than STATE_GRACE ago), as the database store does;
    entries of bursts gone that a bounded trim has not reached yet are left out."""
    from dedup_jobs.stores.base import STATE_GRACE

    redis_client = server_client
    store = get_store(family_store)
    _backlog(redis_client, store.debounce_index_key(), 250,
             _server_ms(redis_client) - int(STATE_GRACE * 1000) - 60_000)
    store.debounce(build_key("debounce", "tests.debounce_record", "live=1"), "m-live",
                   encode_call((1,), {}), now=clock.now(), debounce_for=600, max_wait=None,
                   ttl=STATE_GRACE)
    assert redis_client.zcard(store.debounce_index_key()) > 1  # the trim left some behind
    page = store.debounce_page(offset=0, limit=100, now=clock.now())
    assert page.total == 1 and [state.ident for state in page.items] == ["live=1"]
