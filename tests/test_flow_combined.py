"""R1 and R2 together (docs/jobs.md, docs/migrating.md "From BullMQ"): a
UniqueUntilProcessingJob with ``without_overlapping = True`` and ``on_duplicate =
"replace"`` keeps one run and one waiting copy, and the copy that runs next has the latest
arguments (BullMQ's ``keepLastIfActive``)."""

from __future__ import annotations

import time
from ast import literal_eval
from typing import Any

import pytest
from celery.states import REVOKED

from dedup_jobs.signals import job_deferred
from dedup_jobs.stores.base import running_key
from tests import jobs, jobs_flow
from tests.workers import thread_worker, wait_for, wait_idle

pytestmark = pytest.mark.redis


def test_replace_with_without_overlapping_runs_the_latest_after_the_run(app: Any) -> None:
    """R1 + R2: during a 2 s run, a first dispatch waits (job_deferred) and each later one
    replaces the waiting copy: exactly two runs, never overlapping, the second with the last
    dispatch's arguments; every replaced waiting copy ends REVOKED and never runs."""
    deferred: list[str] = []
    job_deferred.connect(lambda task_id, **kw: deferred.append(task_id), weak=False,
                         dispatch_uid="r1r2")
    try:
        task = jobs_flow.keep_last
        with thread_worker(app, pool="threads", concurrency=2):
            first = task.delay(8, seconds=2, tag=0)
            wait_for(lambda: task.store().get(running_key(task.job_key((8,), {}))), 20)
            waiting = task.delay(8, tag=1)
            wait_for(lambda: waiting.id in deferred, 20)  # it met the run and waits
            later = []
            for tag in (2, 3, 4):
                later.append(task.delay(8, tag=tag))
                time.sleep(0.2)
            assert not any(r.deduplicated for r in later)  # each replaced the waiting one
            assert later[-1].get(timeout=30) == 4 and first.get(timeout=30) == 0
            wait_idle(app)  # the replaced copies' re-published messages came back and ended
        replaced = [waiting, *later[:-1]]
        assert [r.state for r in replaced] == [REVOKED] * len(replaced)
        runs = sorted((literal_eval(v) for v in jobs.runs("keep_last")), key=lambda r: r[2])
        assert [tag for _item, tag, _start, _end in runs] == [0, 4], runs
        assert runs[0][3] <= runs[1][2], f"runs overlap: {runs}"
    finally:
        job_deferred.disconnect(dispatch_uid="r1r2")
