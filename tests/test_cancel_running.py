"""L2 ``on_duplicate = "cancel_running"`` on real prefork workers: a dispatch while the
holder runs asks it to stop (a cooperative body sees ``cancel_requested()`` within a third
of the lease; ``cancel_terminates`` terminates it) and runs after it, never beside it, with
its own arguments; while the holder is queued it replaces it."""

from __future__ import annotations

import time
from typing import Any

import pytest
from celery.exceptions import TaskRevokedError
from celery.states import REVOKED
from django.test import override_settings

from dedup_jobs import clock
from dedup_jobs.signals import unique_job_cancelled, unique_job_replaced
from dedup_jobs.stores.base import running_key
from tests import jobs_flow
from tests.test_flow import PROCESS_STORES, _dedup, _records
from tests.workers import process_worker, wait_for

LEASE = 3.0  # seconds: renewals (and so a cancel's reading) every second


def _env(store: str) -> tuple[dict[str, Any], dict[str, str]]:
    dedup, _database, env = _dedup(store)
    env["DEDUP_JOBS_TEST_LEASE"] = str(LEASE)
    return {**dedup, "LEASE_SECONDS": LEASE}, env


def _started(name: str, item: int, tag: int) -> float | None:
    return next((r[3] for r in _records(name) if r[:3] == (item, tag, "start")), None)


def _revoked_naming(result: Any, by: str) -> None:
    assert result.state == REVOKED, result.state
    with pytest.raises(TaskRevokedError) as raised:
        result.get(timeout=10, propagate=True)
    assert by in str(raised.value), str(raised.value)


@pytest.mark.parametrize("store", PROCESS_STORES)
def test_a_cooperative_run_stops_and_the_new_dispatch_runs_after_it(app: Any,
                                                                    store: str) -> None:
    """A 60 s cooperative run; a second dispatch of its key with other arguments: the run
    sees cancel_requested() within LEASE/3 + 1 s of that dispatch and stops, its result
    REVOKED naming the new id; unique_job_cancelled is sent once; the new dispatch runs
    after it with its own arguments."""
    dedup, env = _env(store)
    sent: list[dict[str, Any]] = []

    def on_cancelled(sender: Any, **kwargs: Any) -> None:
        sent.append(kwargs)

    unique_job_cancelled.connect(on_cancelled)
    try:
        with override_settings(DEDUP_JOBS=dedup), process_worker(concurrency=2, env=env):
            task = jobs_flow.cancel_latest
            first = task.delay(40, tag=0, seconds=60)
            wait_for(lambda: _started("cancel_latest", 40, 0) is not None, 30)
            asked = time.time()
            second = task.delay(40, tag=1, seconds=0.2)
            assert second.get(timeout=30) == 1
            _revoked_naming(first, second.id)
    finally:
        unique_job_cancelled.disconnect(on_cancelled)
    runs = _records("cancel_latest")
    stopped = next(r[3] for r in runs if r[:3] == (40, 0, "stopped"))
    assert stopped - asked <= LEASE / 3 + 1, (stopped - asked, runs)
    started = _started("cancel_latest", 40, 1)
    assert started is not None and started >= stopped, runs
    assert not any(r[:3] == (40, 0, "end") for r in runs), runs
    assert [(s["cancelled_id"], s["by_id"]) for s in sent] == [(first.id, second.id)]


@pytest.mark.parametrize("store", PROCESS_STORES)
def test_cancel_terminates_a_body_that_never_looks(app: Any, store: str) -> None:
    """cancel_terminates on the prefork pool: a 60 s body that never polls is terminated
    when a second dispatch comes; its result REVOKED naming the new id; the lock and the
    running marker pass on: the new dispatch runs, and nothing is held once it has."""
    dedup, env = _env(store)
    with override_settings(DEDUP_JOBS=dedup), process_worker(concurrency=2, env=env):
        task = jobs_flow.cancel_terminating
        first = task.delay(41, tag=0, seconds=60)
        wait_for(lambda: _started("cancel_terminating", 41, 0) is not None, 30)
        second = task.delay(41, tag=1, seconds=0.2)
        assert second.get(timeout=30) == 1
        _revoked_naming(first, second.id)
        key = task.job_key((41,), {})
        wait_for(lambda: task.store().get(key) is None
                 and task.store().get(running_key(key)) is None, 10)
    runs = _records("cancel_terminating")
    assert (41, 0, "end") not in [r[:3] for r in runs], runs
    assert _started("cancel_terminating", 41, 1) is not None


@pytest.mark.parametrize("store", PROCESS_STORES)
def test_while_queued_cancel_running_replaces(app: Any, store: str) -> None:
    """No worker yet: a second dispatch replaces the queued first (REVOKED at once,
    unique_job_replaced, nothing cancelled); once a worker runs, only the second runs."""
    dedup, env = _env(store)
    replaced: list[dict[str, Any]] = []
    cancelled: list[dict[str, Any]] = []

    def on_replaced(sender: Any, **kwargs: Any) -> None:
        replaced.append(kwargs)

    def on_cancelled(sender: Any, **kwargs: Any) -> None:
        cancelled.append(kwargs)

    unique_job_replaced.connect(on_replaced)
    unique_job_cancelled.connect(on_cancelled)
    try:
        with override_settings(DEDUP_JOBS=dedup):
            task = jobs_flow.cancel_latest
            first = task.delay(42, tag=0, seconds=0.1)
            second = task.delay(42, tag=1, seconds=0.1)
            assert first.state == REVOKED
            with process_worker(concurrency=2, env=env):
                assert second.get(timeout=30) == 1
    finally:
        unique_job_replaced.disconnect(on_replaced)
        unique_job_cancelled.disconnect(on_cancelled)
    assert [(r["replaced_id"], r["by_id"]) for r in replaced] == [(first.id, second.id)]
    assert cancelled == []
    assert [r[1] for r in _records("cancel_latest") if r[2] == "start"] == [1]


@pytest.mark.redis
def test_a_failed_publish_withdraws_the_request_to_stop(app: Any, monkeypatch: Any) -> None:
    """U6/L2: the store asked the run to stop, then the publish failed: the error reaches
    the caller, the lock is free again and the run no longer reads a request to stop."""
    task = jobs_flow.cancel_latest
    store, key = task.store(), task.job_key((43,), {})
    run = running_key(key)
    assert store.acquire(key, "runs", 60, now=clock.now()).acquired
    assert store.start_exclusive(key, run, "runs", 60, now=clock.now(), delivery="d").run

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise ConnectionError("broker down")

    monkeypatch.setattr(type(task._get_current_object()), "_publish", broken)
    with pytest.raises(ConnectionError):
        task.delay(43, tag=1)
    assert store.get(key) is None
    renewed = store.renew(run, "runs", 60, now=clock.now())
    assert (renewed.held, renewed.cancel) == (True, None)


@pytest.mark.redis
@pytest.mark.parametrize(("task", "named"), [(jobs_flow.cancel_latest, True),
                                             (jobs_flow.no_overlap, False)])
def test_a_terminated_run_names_the_copy_after_it_only_when_cancelled(
        app: Any, task: Any, named: bool) -> None:
    """L2: the worker's main process, dropping a terminated run (``release_dropped``),
    names the copy queued under its key in the run's REVOKED result on a cancel_running
    job, and leaves Celery's own "terminated" alone on another exclusive job (a revoke
    somebody sent); either way the run's marker is released and the queued lock kept."""
    store, key = task.store(), task.job_key((44,), {})
    run, running, queued = running_key(key), f"running-{named}", f"queued-{named}"
    assert store.acquire(key, running, 60, now=clock.now()).acquired
    assert store.start_exclusive(key, run, running, 60, now=clock.now(), delivery="d").run
    assert store.acquire(key, queued, 60, now=clock.now()).acquired
    task.backend.mark_as_revoked(running, reason="terminated")
    task.release_dropped(running, {**key.as_header("redis")}, (44,), {})
    reason = str(task.AsyncResult(running).result)
    assert (queued in reason) is named and ("terminated" in reason) is not named, reason
    assert store.get(run) is None
    lock = store.get(key)
    assert lock is not None and lock.owner == queued


@pytest.mark.redis
@pytest.mark.parametrize(("task", "named"), [(jobs_flow.cancel_terminating, True),
                                             (jobs_flow.no_overlap, False)])
def test_a_run_the_pool_reports_terminated_late_keeps_the_name_of_its_canceller(
        app: Any, task: Any, named: bool) -> None:
    """L2 on a loaded worker: the pool reports the terminated process late, after the run's
    marker expired and the cancelling dispatch has run and ended: nothing in the store names
    it any more. Celery's announce of the termination (``_announce_revoked``, here on a
    request of the run's message) keeps the reason the cancelling dispatch marked before it
    sent the terminate, instead of Celery's "terminated" (test_cancel_terminates_a_body_
    that_never_looks failed that way in CI's ci-B run, and in 3 of 16 runs beside busy
    loops; 0 of 9 since). A revoke of another exclusive job stays Celery's "terminated"."""
    from celery.contrib.testing.mocks import TaskMessage

    from dedup_jobs.jobs.cancel import cancelled_by
    from dedup_jobs.jobs.request import UniqueRequest

    key = task.job_key((45,), {})
    running, by = f"running-{named}", f"by-{named}"
    if named:
        cancelled_by(task, key, running, by)  # the dispatch's mark, and the terminate sent
    else:
        task.backend.mark_as_revoked(running, reason="revoked by somebody")
    request = UniqueRequest(TaskMessage(task.name, id=running, args=(45,)), app=app, task=task)
    assert task.store().get(key) is None and task.store().get(running_key(key)) is None
    request._announce_revoked("terminated", True, 15, False)
    reason = str(task.AsyncResult(running).result)
    assert (by in reason) is named and (reason == "terminated") is not named, reason


def test_without_a_result_backend_a_terminated_run_keeps_celerys_reason(
        caplog: pytest.LogCaptureFixture) -> None:
    """No result backend (Celery's DisabledBackend: nothing was marked, nothing can be
    read): Celery's reason stands, and no warning is logged for every termination."""
    from types import SimpleNamespace

    from celery import Celery
    from celery.backends.base import DisabledBackend

    from dedup_jobs.jobs.cancel import terminated_reason

    job = SimpleNamespace(name="j", on_duplicate="cancel_running", ignore_result=False,
                          backend=DisabledBackend(Celery("no-backend", set_as_current=False)))
    with caplog.at_level("WARNING"):
        assert terminated_reason(job, "run-1", "terminated") == "terminated"
    assert caplog.records == []
