"""A deferral the broker will not take (T2 with U4): the message fails, and a unique job's
lock goes with it (it stayed queued for unique_for, every dispatch of the key deduplicated
onto a message that never runs). And the wake moves only a waiter's re-publish (its
dedup_jobs_again mark), whichever way the worker finds the held message. From a red-team
of the throttle; each test failed before its fix."""

from __future__ import annotations

import time
import weakref
from typing import Any

import pytest
from celery.worker import state as worker_state
from kombu.asynchronous.timer import Timer
from kombu.exceptions import OperationalError

from dedup_jobs.jobs import wake
from dedup_jobs.jobs.base import DedupJob
from tests import jobs_throttle
from tests.workers import thread_worker


@pytest.mark.redis
@pytest.mark.worker
def test_a_deferral_the_broker_refuses_fails_and_releases_the_lock(
        app: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two calls of a unique job with concurrency = 1 at once: one runs, the other must
    wait, and its re-publish fails (the broker refuses it). That one fails with the
    broker's error, and its lock is released."""

    def refused(*args: Any, **kwargs: Any) -> None:
        raise OperationalError("the broker is down (injected)")

    monkeypatch.setattr(DedupJob, "publish_again", refused)
    task = jobs_throttle.unique_one_at_once
    store = task.store()
    results = [task.delay(item, seconds=1.0) for item in (801, 802)]
    with thread_worker(app, pool="threads", concurrency=2):
        outcomes = []
        for result in results:
            try:
                outcomes.append(result.get(timeout=20))
            except OperationalError:
                outcomes.append("refused")
        deadline = time.monotonic() + 10
        held = [store.get(task.job_key((item,), {})) for item in (801, 802)]
        while any(held) and time.monotonic() < deadline:
            time.sleep(0.05)
            held = [store.get(task.job_key((item,), {})) for item in (801, 802)]
    assert sorted(map(str, outcomes)) in (["801", "refused"], ["802", "refused"]), outcomes
    assert held == [None, None], held


class Held:
    """A request the worker holds for its countdown (Celery's Request, as _move reads it)."""

    def __init__(self, task_id: str, headers: dict[str, Any]) -> None:
        self.id = task_id
        self.request_dict = headers
        self._eta_timer_entry: Any = None


@pytest.mark.parametrize(("headers", "moved"), [
    pytest.param({"retries": 0, wake.AGAIN: 0}, True, id="a waiter's re-publish"),
    pytest.param({"retries": 0}, False, id="the project's own publish of the id"),
    pytest.param({"retries": 1, wake.AGAIN: 0}, False, id="a retry of the woken run"),
])
def test_a_wake_moves_only_a_waiters_re_publish(
        monkeypatch: pytest.MonkeyPatch, headers: dict[str, Any], moved: bool) -> None:
    """docs/throttling.md#wake: the wake cuts only a waiter's countdown. _move took the first
    held request of the id, whatever it was (only a remembered wake checked the mark)."""
    timer = Timer()
    held = Held("w", headers)
    held._eta_timer_entry = timer.call_after(60, lambda: None, ())
    monkeypatch.setattr(worker_state, "scheduled_requests", weakref.WeakSet([held]))
    entry = held._eta_timer_entry
    assert wake._move(timer, "w") is moved
    if not moved:  # left waiting for its countdown, untouched
        assert held._eta_timer_entry is entry and not entry.canceled
        assert any(e.entry is entry for e in timer._queue)
