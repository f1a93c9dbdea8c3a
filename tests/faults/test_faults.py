"""Fault injection on the lock store (issue 11): a private redis-server made slow (busy Lua
script), stopped (SIGSTOP), flushed, or reached through a proxy that loses or delays one
reply. The Celery broker and result backend stay on the healthy test Redis; the workers are
real (in-process, tests.workers.thread_worker). Every store call of the store's client gives up
after SOCKET_TIMEOUT 0.5 s; DEDUP_JOBS["STORE_TIMEOUT"] = 1.0, LEASE_SECONDS = 3.

W5 (redelivered broker messages) is in test_redelivery.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from celery.signals import after_task_publish

from dedup_jobs.exceptions import StoreUnavailable
from tests.faults.jobs import DEBOUNCE_FOR, bodies, fault_debounced, fault_unique, overlaps
from tests.faults.proxy import Proxy
from tests.faults.servers import STALLS, RedisServer
from tests.faults.store import LEASE_SECONDS, burst_of, faulty_store, lock_of, until
from tests.guard_support import token
from tests.workers import thread_worker, wait_for

pytestmark = [pytest.mark.redis, pytest.mark.worker]

#: how long the store stays silent: longer than any bounded store call (STORE_TIMEOUT 1 s)
STALL_SECONDS = 2.0
#: the stall kinds of the trials of one test (tests.faults.servers)
TRIALS = ("busy", "paused", "busy")
#: slack on every deadline (a loaded 2-core machine)
SLACK = 0.5


@pytest.fixture
def published() -> Iterator[list[dict[str, Any]]]:
    """Every message published from the test's own thread (not re-publishes by workers)."""
    sent: list[dict[str, Any]] = []
    me = threading.get_ident()

    def on_publish(sender: Any = None, headers: Any = None, body: Any = None, **_: Any) -> None:
        if threading.get_ident() == me:
            sent.append({"task": sender, "id": (headers or {}).get("id"), "args": list(body[0])})

    after_task_publish.connect(on_publish, weak=False)
    yield sent
    after_task_publish.disconnect(on_publish)


def _ready(results: list[Any], timeout: float) -> bool:
    return until(lambda: all(r.ready() for r in results), timeout)[0]


def _stalled_dispatch(server: RedisServer, kind: str, dispatch: Any) -> tuple[Any, float]:
    """Dispatch while the store is stalled STALL_SECONDS; return (what dispatch raised or
    returned, when the store answered again)."""
    stall = STALLS[kind](server, STALL_SECONDS)
    try:
        outcome: Any = dispatch()
    except StoreUnavailable as exc:
        outcome = exc
    return outcome, stall.wait()


def test_unique_dispatch_during_a_stall_leaves_no_lock(
    app: Any, private_redis: RedisServer
) -> None:
    """S7, S4, U6: "A dispatch raises StoreUnavailable ("nothing published") yet leaves a lock
    behind: the EVALSHA already sent runs when Redis resumes, after the caller gave up" —
    S7: a dispatch that ends in StoreUnavailable leaves no lock behind once the store answers
    again (compare-and-delete within LEASE_SECONDS); no duplicate is deduplicated onto an id
    that was never published. Three trials (busy script, SIGSTOP, busy script)."""
    failed: list[str] = []
    with faulty_store(private_redis.url()), thread_worker(app, pool="threads", concurrency=2):
        # Connections made (and the script loaded) before the first stall.
        assert fault_unique.delay(token(), 0).get(timeout=10) == 0
        for trial, kind in enumerate(TRIALS):
            t = token()
            outcome, back = _stalled_dispatch(
                private_redis, kind, lambda t=t: fault_unique.delay(t, 1)
            )
            problems = []
            if not isinstance(outcome, StoreUnavailable):
                problems.append(f"the dispatch did not raise StoreUnavailable: {outcome!r}")
            gone, _took = until(
                lambda t=t: lock_of(fault_unique, t) is None,
                LEASE_SECONDS + SLACK - (time.monotonic() - back),
            )
            if not gone:
                left = lock_of(fault_unique, t)
                problems.append(
                    f"the lock of never-published id {left.owner} ({left.state}) is still held "
                    f"{time.monotonic() - back:.1f}s after the store answered again (expires in "
                    f"{left.expires_at - time.time():.0f}s)"
                )
            again = fault_unique.delay(t, 2)
            if again.deduplicated:
                problems.append(
                    f"the next dispatch was deduplicated onto {again.id}, which was never published"
                )
            elif not _ready([again], 10) or again.result != 2:
                problems.append(f"the next dispatch did not run: {again.state}")
            if problems:
                failed.append(f"trial {trial} ({kind}): " + "; ".join(problems))
    assert not failed, f"{len(failed)} of {len(TRIALS)} trials:\n" + "\n".join(failed)


def test_debounced_dispatch_during_a_stall_leaves_no_burst(
    app: Any, private_redis: RedisServer
) -> None:
    """S7, S4: "Same for a DebouncedJob: an orphan burst state, later dispatches absorbed into
    it, nothing runs" — S7: a dispatch that ends in StoreUnavailable leaves no debounce state
    behind once the store answers again; the next dispatch starts a burst that runs (D1).
    Three trials (busy script, SIGSTOP, busy script)."""
    failed: list[str] = []
    with faulty_store(private_redis.url()), thread_worker(app, pool="threads", concurrency=2):
        assert fault_debounced.delay(token(), 0).get(timeout=10) == 0
        for trial, kind in enumerate(TRIALS):
            t = token()
            outcome, back = _stalled_dispatch(
                private_redis, kind, lambda t=t: fault_debounced.delay(t, 1)
            )
            problems = []
            if not isinstance(outcome, StoreUnavailable):
                problems.append(f"the dispatch did not raise StoreUnavailable: {outcome!r}")
            gone, _took = until(
                lambda t=t: burst_of(fault_debounced, t) is None,
                LEASE_SECONDS + SLACK - (time.monotonic() - back),
            )
            if not gone:
                left = burst_of(fault_debounced, t)
                problems.append(
                    f"an orphan burst (message {left.message_id}, never published, "
                    f"{left.count} dispatches) is still there {time.monotonic() - back:.1f}s "
                    f"after the store answered again"
                )
            again = fault_debounced.delay(t, 2)
            if not _ready([again], DEBOUNCE_FOR + 3):
                problems.append(
                    f"the next dispatch never ran: {again.id} {again.state}, "
                    f"runs {[b['value'] for b in bodies(t)]}"
                )
            elif again.result != 2 or [b["value"] for b in bodies(t)] != [2]:
                problems.append(f"ran {[b['value'] for b in bodies(t)]}, result {again.result}")
            if problems:
                failed.append(f"trial {trial} ({kind}): " + "; ".join(problems))
    assert not failed, f"{len(failed)} of {len(TRIALS)} trials:\n" + "\n".join(failed)


def test_lost_debounce_reply_does_not_swallow_the_burst(
    app: Any, store_proxy: Proxy, published: list[dict[str, Any]]
) -> None:
    """D1, D4, S7: "A debounced burst is lost silently: when the DEBOUNCE reply is late and the
    store re-sends the script, the second run sees the burst as existing, so .delay() returns
    normally, no message is ever published" — S7: a store call re-sent after a lost reply
    returns the same answer as the first. The proxy loses the reply to the burst's first
    DEBOUNCE after Redis ran it; the client re-sends. Then: exactly one message published
    for the burst, it runs once with the last arguments, every dispatch's result is ready."""
    with faulty_store(store_proxy.url()), thread_worker(app):
        assert fault_debounced.delay(token(), 0).get(timeout=10) == 0  # scripts loaded
        t = token()
        lost = store_proxy.drop_next_reply(match=t.encode())
        results = [fault_debounced.delay(t, 1)]
        assert lost.wait(0), "the proxy saw no DEBOUNCE request for the burst"
        results += [fault_debounced.delay(t, value) for value in (2, 3)]
        all_ready = _ready(results, DEBOUNCE_FOR + 5)
        messages = sorted({m["id"] for m in published if m["args"][:1] == [t]})
        ran = [b["value"] for b in bodies(t)]
        states = [(r.id, r.state) for r in results]
    assert len(messages) == 1 and ran == [3] and all_ready, (
        f"messages published for the burst: {messages}; bodies ran with {ran}; results {states}"
    )
    assert [r.result for r in results] == [3, 3, 3]


@pytest.mark.parametrize("fault", ["lost", "late"])
def test_claim_reply_lost_or_late_runs_latest_and_readies_every_result(
    app: Any, store_proxy: Proxy, fault: str
) -> None:
    """D4, S7: "A due burst whose CLAIM reply is late runs with the first dispatch's arguments
    and leaves the other dispatches' results PENDING" — D1/D4: the run uses the latest
    dispatch's arguments and every absorbed dispatch's AsyncResult reaches a ready state with
    the run's result; S7: the CLAIM re-sent by the message that claimed the burst gets the same
    latest arguments and absorbed ids. The proxy loses the worker's CLAIM reply (or holds it
    1.5 s, past the client's 0.5 s timeout) after Redis ran it."""
    with faulty_store(store_proxy.url()):
        with thread_worker(app):
            assert fault_debounced.delay(token(), 0).get(timeout=10) == 0  # scripts loaded
        t = token()
        results = [fault_debounced.delay(t, value) for value in (1, 2, 3)]
        time.sleep(DEBOUNCE_FOR + 0.3)  # due: the worker's first store call is its CLAIM
        if fault == "lost":
            armed = store_proxy.drop_next_reply(match=t.encode())
        else:
            armed = store_proxy.delay_next_reply(1.5, match=t.encode())
        with thread_worker(app):
            wait_for(lambda: armed.fired.is_set(), timeout=10)
            all_ready = _ready(results, 8)
            ran = [b["value"] for b in bodies(t)]
            states = [(r.id, r.state, r.result) for r in results]
    assert ran == [3] and all_ready, f"bodies ran with {ran}; results {states}"
    assert [r.result for r in results] == [3, 3, 3], states


def test_flushed_lock_of_a_running_job_is_taken_back(app: Any, private_redis: RedisServer) -> None:
    """W6: "A flushed or evicted lock is never re-taken: FLUSHDB while a 6 s job runs, then a
    dispatch: it is published and runs beside the first" — W6: the next renewal (within
    LEASE_SECONDS / 3) takes the lock back for the same owner when the key is free, so a
    dispatch after that point is deduplicated and never runs beside it. A 4 s body,
    LEASE_SECONDS = 3, FLUSHDB of the store's server while it runs."""
    t = token()
    with faulty_store(private_redis.url()), thread_worker(app, pool="threads", concurrency=2):
        first = fault_unique.delay(t, 1, seconds=4.0)
        wait_for(lambda: bodies(t), timeout=10)
        private_redis.client.flushdb()
        back, took = until(
            lambda: getattr(lock_of(fault_unique, t), "owner", None) == first.id,
            LEASE_SECONDS / 3 + SLACK,
        )
        second = fault_unique.delay(t, 2)
        _ready([first, second], 10)
        rows = bodies(t)
        lock_after = lock_of(fault_unique, t)
    zero = rows[0]["start"]
    ran = [
        (row["value"], round(row["start"] - zero, 2), round((row["end"] or zero) - zero, 2))
        for row in rows
    ]
    assert back, (
        f"the running job's lock was not back under {first.id} within {took:.1f}s of the "
        f"FLUSHDB; a dispatch after that was "
        f"{'deduplicated' if second.deduplicated else 'published'}"
        f"; bodies (value, start, end): {ran}; overlapping: {len(overlaps(t))}"
    )
    assert second.deduplicated and second.id == first.id, (second.id, first.id, ran)
    assert not overlaps(t) and len(rows) == 1, ran
    assert lock_after is None, lock_after  # released when the job finished
