"""U3, U1/U2 and D1/D3 on a real cluster (S5): processes dispatching at once, and a prefork
worker in a subprocess whose store is the cluster."""

from __future__ import annotations

import json
import multiprocessing
import time
from typing import Any

import pytest
from celery.result import AsyncResult
from django.conf import settings
from django.test import override_settings

from dedup_jobs.stores import get_store
from tests import contention, jobs
from tests import jobs_debounce as debounce_jobs
from tests.cluster.servers import Cluster
from tests.test_concurrency import DISPATCHES, PROCESSES, ROUNDS, queued
from tests.workers import process_worker, wait_for

pytestmark = [pytest.mark.redis, pytest.mark.worker]


def storm(app: Any, found: Cluster) -> list[int]:
    """ROUNDS rounds of PROCESSES processes x DISPATCHES dispatches of one key each round
    (a new key per round), through the cluster store: the messages published per round."""
    dedup = {**settings.DEDUP_JOBS, "STORE": "cluster"}
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Manager().Barrier(PROCESSES)
    figures = []
    initargs = (barrier, dedup, None, "", {"cluster": found.cache()})
    with ctx.Pool(PROCESSES, initializer=contention.init, initargs=initargs) as pool:
        for round_ in range(ROUNDS):
            results = pool.starmap(
                contention.burst, [(1000 + round_, DISPATCHES)] * PROCESSES, chunksize=1)
            assert sum(len(r) for r in results) == PROCESSES * DISPATCHES
            figures.append(sum(sum(r) for r in results))
            assert queued(app) == round_ + 1
    return figures


@pytest.mark.parametrize("kind", [
    pytest.param("redis", id="redis-cluster"),
    pytest.param("valkey", id="valkey-cluster"),
])
@pytest.mark.matrix  # 25 s a cluster on 2 cores
def test_processes_publish_exactly_one_message_on_the_cluster(
    app: Any, kind: str, request: pytest.FixtureRequest,
) -> None:
    """U3/S5 (issue 13 acceptance): 8 processes x 200 same-key dispatches, 5 rounds, on a
    3-primary cluster: exactly one message published per round."""
    found: Cluster = request.getfixturevalue(f"{kind}_cluster")
    found.flush()
    started = time.monotonic()
    figures = storm(app, found)
    print(f"U3 {kind} cluster: messages published per round of {PROCESSES * DISPATCHES} "
          f"dispatches: {figures} ({time.monotonic() - started:.1f} s)")
    assert figures == [1] * ROUNDS


def test_a_prefork_worker_on_the_cluster_runs_unique_and_debounced_jobs_once(
    app: Any, redis_cluster: Cluster,
) -> None:
    """U1/U2/D1/D3 on S5: with the cluster as its store, a prefork worker in a subprocess
    runs three dispatches of one unique job once and releases the lock (the worker checked
    and released it on the cluster), and five dispatches of one debounced id once, with the
    last arguments, every dispatch's result being that run's."""
    redis_cluster.flush()
    entry = redis_cluster.cache()
    env = {"DJANGO_SETTINGS_MODULE": "tests.cluster.settings",
           "DEDUP_JOBS_TEST_CLUSTER_CACHE": json.dumps(entry)}
    with override_settings(CACHES={**settings.CACHES, "cluster": entry},
                           DEDUP_JOBS={**settings.DEDUP_JOBS, "STORE": "cluster"}):
        unique = [jobs.unique_sleep.delay(5, 0.5) for _ in range(3)]
        assert [r.deduplicated for r in unique] == [False, True, True]
        assert len({r.id for r in unique}) == 1
        key = jobs.unique_sleep.job_key((5, 0.5), {})
        assert get_store("cluster").get(key) is not None
        burst = [debounce_jobs.debounce_record.delay(7, value) for value in range(5)]
        with process_worker(concurrency=2, env=env):
            assert unique[0].get(timeout=30) == 5
            assert [AsyncResult(r.id, app=app).get(timeout=30) for r in burst] == [4] * 5
            wait_for(lambda: get_store("cluster").get(key) is None, timeout=10)
        assert jobs.runs("unique_sleep") == ["5"]
        assert debounce_jobs.values("record") == [[7, 4]]
        assert list(get_store("cluster").iter_debounces()) == []
