"""W3 signal and the until-processing flavour of "only the owner releases", with an in-process
worker (threads pool) so the test can listen to the signals the worker sends."""

from __future__ import annotations

from typing import Any

import pytest
from celery.exceptions import TaskRevokedError

from dedup_jobs.signals import unique_job_skipped
from tests import jobs_guard as jg
from tests.guard_support import lock_of, token
from tests.workers import thread_worker, wait_for

pytestmark = [pytest.mark.redis, pytest.mark.worker]


def test_worker_skip_sends_unique_job_skipped(app: Any) -> None:
    """W3: a message skipped at the worker sends unique_job_skipped(sender=the job class,
    task_id=the skipped id, holder_id=the holder's id, key=the lock key, stage="worker") and
    ends REVOKED; its body does not run."""
    t = token()
    sent: list[dict[str, Any]] = []

    def listen(sender: Any, **kwargs: Any) -> None:
        sent.append({"sender": sender, **kwargs})

    unique_job_skipped.connect(listen, weak=False)
    try:
        with thread_worker(app, pool="threads", concurrency=2):
            holder = jg.guard_gated.delay(t, 1, gate=t)
            wait_for(lambda: jg.runs(t))
            stray = app.send_task("tests.guard_gated", (t, 1))
            with pytest.raises(TaskRevokedError):
                stray.get(timeout=20)
            jg.open_gate(t)
            assert holder.get(timeout=20) == 1
    finally:
        unique_job_skipped.disconnect(listen)
    worker_stage = [s for s in sent if s["stage"] == "worker"]
    assert worker_stage == [
        {
            "sender": type(app.tasks["tests.guard_gated"]),
            "signal": unique_job_skipped,
            "task_id": stray.id,
            "holder_id": holder.id,
            "key": jg.guard_gated.job_key((t, 1), {}).key,
            "stage": "worker",
            "observed": False,  # R3: every signal carries observed
        }
    ]
    assert jg.runs(t) == ["1"]


def test_until_processing_run_never_releases_the_next_owners_lock(app: Any) -> None:
    """P1/U4: an until-processing job releases its lock as it starts; a dispatch during the
    run takes the lock (queued, with a countdown); the first run finishing leaves that lock
    alone; the second copy then runs. Executions: 2."""
    t = token()
    with thread_worker(app, pool="threads", concurrency=2):
        first = jg.guard_until_processing.delay(t, gate=t)
        wait_for(lambda: jg.runs(t))
        assert lock_of(jg.guard_until_processing, t) is None
        second = jg.guard_until_processing.apply_async((t,), countdown=1.5)
        assert second.deduplicated is False
        jg.open_gate(t)
        assert first.get(timeout=20) == t
        lock = lock_of(jg.guard_until_processing, t)
        assert lock is not None and lock.owner == second.id
        assert second.get(timeout=20) == t
    assert jg.runs(t) == ["'run'", "'run'"]
    assert lock_of(jg.guard_until_processing, t) is None
