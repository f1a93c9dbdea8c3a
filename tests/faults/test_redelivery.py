"""W5 with the real Redis broker: a message whose acks_late body runs longer than the broker's
``visibility_timeout`` (2 s here) is restored to the queue and delivered again, with the same
task id and ``delivery_info["redelivered"]``, to a second worker started meanwhile (a deploy,
an autoscaler). Prefork subprocess workers (tests.guard_support), settings tests.settings_guard;
bodies and deliveries recorded by tests/faults/jobs.py in the run-record db."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from dedup_jobs.stores import get_store
from tests.faults.jobs import bodies, fault_acks_late, fault_acks_late_one_at_once, marks, overlaps
from tests.guard_support import (
    BROKERS,
    QUEUE,
    kill_worker,
    lock_of,
    publishing_to,
    reset_queue,
    token,
    worker_env,
)
from tests.jobs_guard import guard_ping, open_gate
from tests.workers import process_worker, wait_for

pytestmark = [pytest.mark.redis, pytest.mark.worker]

VISIBILITY = 2.0
URL = BROKERS["redis"]


@contextmanager
def worker(queue: str, lease: float, *, concurrency: int) -> Iterator[subprocess.Popen[bytes]]:
    """A prefork worker on the Redis broker, ready when yielded (it answered a ping). It
    prefetches one message per process, so a busy one never takes the restored copy itself."""
    env = worker_env(
        queue,
        {
            "DEDUP_JOBS_TEST_VISIBILITY": str(VISIBILITY),
            "DEDUP_JOBS_TEST_LEASE_SECONDS": str(lease),
        },
    )
    with process_worker(
        concurrency=concurrency, env=env, broker=URL, extra=("--prefetch-multiplier", "1")
    ) as proc:
        assert guard_ping.apply_async(queue=queue).get(timeout=60) == "pong"
        yield proc


def _stored(result: Any) -> tuple[Any, ...]:
    """The task's outcome as the result backend holds it now (not AsyncResult's cache)."""
    meta = result.backend.get_task_meta(result.id, cache=False)
    return meta["status"], meta["result"], meta.get("date_done")


def _table(t: str) -> list[tuple[Any, ...]]:
    """Bodies of ``t`` as (task id, pid, redelivered, start, end), times relative to the first."""
    rows = bodies(t)
    zero = rows[0]["start"] if rows else 0.0
    return [
        (
            r["task_id"][:8],
            r["pid"],
            r["redelivered"],
            round(r["start"] - zero, 2),
            None if r["end"] is None else round(r["end"] - zero, 2),
        )
        for r in rows
    ]


def test_redelivered_copy_never_runs_beside_the_first_nor_after_it(app: Any) -> None:
    """W5: "A redelivered message runs beside the original: with the Redis broker, a UniqueJob
    that runs longer than visibility_timeout is restored by a worker that starts meanwhile and
    runs twice at once, same task id" — W5: a second delivery never runs its body while the
    first run lives (the copy waits); a copy marked redelivered that arrives after the first
    run finished is dropped without touching the task's SUCCESS result. LEASE_SECONDS = 3."""
    t = token()
    queue = f"{QUEUE}-w5-{t}"
    reset_queue(app, URL, queue)
    with publishing_to(app, URL), worker(queue, 3.0, concurrency=1):
        result = fault_acks_late.apply_async((t,), {"gate": t}, queue=queue)
        wait_for(lambda: bodies(t), timeout=30)
        with worker(queue, 3.0, concurrency=2):
            # The broker restores the unacked message VISIBILITY s after it was delivered;
            # the new worker takes the copy (the first, busy, prefetches nothing more).
            wait_for(lambda: any(d["redelivered"] for d in marks(t, "delivery")), timeout=30)
            time.sleep(1.0)  # a copy that does run has started by now
            during = _table(t)
            open_gate(t)
            assert result.get(timeout=30) == t
            done = _stored(result)
            # The copy comes back (re-published, or restored again) and must find the run over.
            time.sleep(VISIBILITY + 3.0 / 3 + 2.0)
            after = _table(t)
            deliveries = [(d["task_id"][:8], d["redelivered"]) for d in marks(t, "delivery")]
            final = _stored(result)
    assert len(during) == 1 and not overlaps(t), (
        f"the redelivered copy ran beside the first: bodies (id, pid, redelivered, start, end) "
        f"{during}; deliveries {deliveries}"
    )
    assert len(after) == 1, f"the copy ran after the first finished: {after}"
    assert done[:2] == ("SUCCESS", t) and final == done, (done, final)
    assert lock_of(fault_acks_late, t) is None


def test_copy_of_a_killed_worker_runs_once_its_lease_expired(app: Any) -> None:
    """W5: "if the first run's worker died the copy runs (at-least-once, as acks_late
    promises)" — and the worker tells a dead first run from a live one by its lease: the copy
    runs only once the dead run's lease expired. The first worker is SIGKILLed mid-run;
    LEASE_SECONDS = 9, so its lock outlives the broker's 2 s restore and the second worker's
    start-up."""
    lease = 9.0
    t = token()
    queue = f"{QUEUE}-w5kill-{t}"
    reset_queue(app, URL, queue)
    with publishing_to(app, URL):
        with worker(queue, lease, concurrency=1) as first:
            result = fault_acks_late.apply_async((t,), {"gate": t}, queue=queue)
            wait_for(lambda: bodies(t), timeout=30)
            kill_worker(first)
        held = lock_of(fault_acks_late, t)
        assert held is not None and held.owner == result.id, held
        open_gate(t)  # the copy, when it runs, finishes at once
        with worker(queue, lease, concurrency=2):
            assert result.get(timeout=lease + 20) == t
            rows = bodies(t)
    assert len(rows) == 2 and rows[0]["end"] is None, _table(t)
    copy = rows[1]
    # The body that runs is the broker's copy or the copy it re-published while the dead run's
    # lock still stood (W5: "re-published with a countdown"), which is a fresh delivery.
    assert copy["task_id"] == result.id, _table(t)
    assert copy["start"] >= held.expires_at - 0.2, (
        f"the copy started {held.expires_at - copy['start']:.1f}s before the killed run's "
        f"lease expired: bodies (id, pid, redelivered, start, end) {_table(t)}"
    )


def _slots(task: Any, *args: Any) -> int:
    """The concurrency slots held at the throttle key of ``task(*args)`` (T5's count)."""
    key = task.throttle_key(args, {})
    store = get_store(task.throttle_alias())
    page = store.throttle_page(offset=0, limit=100, task_name=key.task_name, now=time.time())
    return sum(item.running for item in page.items if item.key == key.key)


def test_copy_put_off_leaves_the_first_runs_slot_held(app: Any) -> None:
    """W5 + T2: the broker's copy of a running message (same task id) is admitted into the
    first run's concurrency slot and put off; it must not release that slot on its way out,
    or the first run goes on outside the limit and another message of the throttle key runs
    beside it. ``concurrency = 1``, LEASE_SECONDS = 3 (the copy comes back every second)."""
    t = token()
    queue = f"{QUEUE}-w5slot-{t}"
    reset_queue(app, URL, queue)
    job = fault_acks_late_one_at_once
    with publishing_to(app, URL), worker(queue, 3.0, concurrency=1):
        first = job.apply_async((t,), {"value": 0, "gate": t}, queue=queue)
        wait_for(lambda: bodies(t), timeout=30)
        with worker(queue, 3.0, concurrency=2):
            # the broker's copy, then the copy it re-published after being put off: the
            # first put-off (its release, if any) is over by then
            wait_for(lambda: len([d for d in marks(t, "delivery")
                                  if d["task_id"] == first.id]) >= 3, timeout=30)
            held = _slots(job, t)
            other = job.apply_async((t,), {"value": 1, "gate": t}, queue=queue)
            # the other message is decided: deferred (it comes back: a second delivery) or run
            wait_for(lambda: len([d for d in marks(t, "delivery")
                                  if d["task_id"] == other.id]) >= 2
                     or any(b["task_id"] == other.id for b in bodies(t)), timeout=30)
            during = _table(t)
            open_gate(t)
            assert first.get(timeout=30) == 0 and other.get(timeout=30) == 1
    assert held == 1, f"the first run's slot was freed by its put-off copy: {held} held"
    assert len(during) == 1 and not overlaps(t), (
        f"a second run of the throttle key ran beside the first (concurrency = 1): bodies "
        f"(id, pid, redelivered, start, end) {during}")
