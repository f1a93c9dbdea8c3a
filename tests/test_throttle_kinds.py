"""T1: the throttle options on the other kinds (UniqueJob, DebouncedJob), keyed apart from
their unique/debounce id, and the job_deferred signal of a deferral (T2-T4), on an
in-process worker (its signals are seen here) with the Redis store."""

from __future__ import annotations

import itertools
import time
from ast import literal_eval
from typing import Any

import pytest

from dedup_jobs.signals import job_deferred
from tests import jobs, jobs_throttle
from tests.workers import thread_worker

pytestmark = pytest.mark.redis


def _records(name: str) -> list[Any]:
    return [literal_eval(value) for value in jobs.runs(name)]


def test_unique_job_with_concurrency_one(app: Any) -> None:
    """T1/T2: a UniqueJob with concurrency=1 (throttle key: the task name): three different
    unique ids on a worker with 3 threads never run at once; each deferral sends
    job_deferred (reason "concurrency", until in epoch seconds, observed False) and the
    deferred message keeps its unique lock (a duplicate of it is deduplicated onto it)."""
    got: list[dict[str, Any]] = []
    job_deferred.connect(lambda **kw: got.append(kw), weak=False, dispatch_uid="t1")
    try:
        task = jobs_throttle.unique_one_at_once
        with thread_worker(app, pool="threads", concurrency=3):
            results = [task.delay(item, seconds=0.4) for item in (1, 2, 3)]
            deadline = time.time() + 10
            while not got and time.time() < deadline:
                time.sleep(0.02)
            waiting = got[0]["task_id"]
            item = next(i for i, r in zip((1, 2, 3), results, strict=True) if r.id == waiting)
            duplicate = task.delay(item)
            assert duplicate.deduplicated and duplicate.id == waiting
            assert [r.get(timeout=30) for r in results] == [1, 2, 3]
    finally:
        job_deferred.disconnect(dispatch_uid="t1")
    runs = sorted(_records("unique_one_at_once"), key=lambda r: r[1])
    assert len(runs) == 3
    for before, after in itertools.pairwise(runs):
        assert before[2] <= after[1], f"runs overlap: {before} and {after}"
    first = got[0]
    assert first["reason"] == "concurrency" and first["observed"] is False
    assert time.time() - 30 < first["until"] < time.time() + 30
    assert first["key"] == "dedup_jobs:throttle:tests.unique_one_at_once:tests.unique_one_at_once"


def test_debounced_job_with_a_rate(app: Any) -> None:
    """T1/T3: a DebouncedJob with throttle="1/s": bursts of two debounce ids, due at once,
    run once each (D1) with their latest arguments, 1 s apart at least; the later one was
    deferred with reason "throttle"."""
    got: list[dict[str, Any]] = []
    job_deferred.connect(lambda **kw: got.append(kw), weak=False, dispatch_uid="t3")
    try:
        task = jobs_throttle.debounced_throttled
        with thread_worker(app, pool="threads", concurrency=2):
            first = [task.delay(1), task.delay(1)]
            second = [task.delay(2), task.delay(2)]
            assert first[0].get(timeout=30) == 1 and second[0].get(timeout=30) == 2
    finally:
        job_deferred.disconnect(dispatch_uid="t3")
    runs = sorted(_records("debounced_throttled"), key=lambda r: r[1])
    assert [item for item, _at in runs] in ([1, 2], [2, 1])
    assert runs[1][1] - runs[0][1] >= 1.0, runs
    assert [g["reason"] for g in got] == ["throttle"]
