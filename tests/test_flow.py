"""Flow control on the unique kinds (SPEC section 9): R1 replace, R2 without_overlapping,
R3 observe-only, on real prefork workers (in-process workers where signals are counted) and
real Redis, PostgreSQL and MariaDB."""

from __future__ import annotations

import itertools
import multiprocessing
import time
from ast import literal_eval
from typing import Any

import kombu
import pytest
from celery.exceptions import TaskRevokedError
from celery.states import READY_STATES, REVOKED
from django.conf import settings
from django.db import connections
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from dedup_jobs import clock
from dedup_jobs.jobs.base import HEADER
from dedup_jobs.signals import job_deferred, unique_job_replaced, unique_job_skipped
from dedup_jobs.stores import get_store
from dedup_jobs.stores.base import running_key
from tests import contention, jobs, jobs_flow
from tests.test_stores import MEMORY, delta, load_scripts
from tests.workers import process_worker, thread_worker, wait_for, wait_idle

#: the prefork worker tests' stores: Redis in the README's command, the database store in the
#: slow matrix (``uv run pytest -m matrix``)
PROCESS_STORES = [
    pytest.param("redis", marks=pytest.mark.redis, id="django-redis"),
    pytest.param("database-postgres", marks=[pytest.mark.postgres, pytest.mark.matrix],
                 id="database-postgres"),
    pytest.param("database-mariadb", marks=[pytest.mark.mariadb, pytest.mark.matrix],
                 id="database-mariadb"),
]


def _dedup(store: str) -> tuple[dict[str, Any], tuple[str, str] | None, dict[str, str]]:
    """DEDUP_JOBS, the (alias, test database name) of the database store and the worker's
    environment."""
    env = {"DJANGO_SETTINGS_MODULE": "tests.settings_flow", "DEDUP_JOBS_TEST_FLOW_STORE": store}
    if store == "redis":
        return {"STORE": "redis", "LEASE_SECONDS": 60}, None, env
    alias = store.removeprefix("database-")
    name = str(settings.DATABASES[alias]["NAME"])
    env["DEDUP_JOBS_TEST_FLOW_DB_NAME"] = name
    dedup = {"STORE": "database", "DATABASE_ALIAS": alias, "LEASE_SECONDS": 60}
    return dedup, (alias, name), env


def _records(name: str) -> list[Any]:
    return [literal_eval(value) for value in jobs.runs(name)]


# -- R1 -----------------------------------------------------------------------------------


def test_take_over_replaces_only_a_queued_holder(store_name: str) -> None:
    """R1: the store's take-over, on every store: free → taken; held queued by another →
    the lock passes and the replaced owner is named; a re-send answers the same (S7); held
    running → not taken, the holder named."""
    task = jobs_flow.replace_latest
    store, key, now = task.store(), task.job_key((1,), {}), clock.now()
    first = store.take_over(key, "owner-a", 60, now=now)
    assert first.acquired and first.replaced is None
    second = store.take_over(key, "owner-b", 60, now=now)
    assert second.acquired and second.replaced == "owner-a"
    again = store.take_over(key, "owner-b", 60, now=now)
    assert again.acquired and again.replaced == "owner-a"
    assert store.get(key).owner == "owner-b"  # type: ignore[union-attr]
    assert store.start(key, "owner-b", 60, now=now, release=False).run
    third = store.take_over(key, "owner-c", 60, now=now)
    assert not third.acquired and third.holder == "owner-b"


@pytest.mark.parametrize("store", PROCESS_STORES)
def test_replace_storm_one_owner_one_run(app: Any, store: str) -> None:
    """R1: 8 processes dispatch one replacing copy each at once: exactly one ends holding
    the lock, every other result is REVOKED at once with a reason naming a later id, and a
    prefork worker started afterwards (no revoke reached it) runs exactly one body, the
    owner's, with its own arguments; the replaced results stay REVOKED."""
    dedup, database, env = _dedup(store)
    with override_settings(DEDUP_JOBS=dedup):
        ctx = multiprocessing.get_context("spawn")
        barrier = ctx.Manager().Barrier(8)
        with ctx.Pool(8, initializer=contention.init, initargs=(barrier, dedup, database)) as pool:
            ids = pool.starmap(contention.replace_burst, [(7, value) for value in range(8)],
                               chunksize=1)
        assert len(set(ids)) == 8  # every dispatch was published with its own id
        task = jobs_flow.replace_latest
        lock = task.store().get(task.job_key((7,), {}))
        assert lock is not None and lock.owner in ids
        owner = lock.owner
        replaced = [task_id for task_id in ids if task_id != owner]
        for task_id in replaced:
            result = task.AsyncResult(task_id)
            assert result.state == REVOKED
            assert "replaced by task" in str(result.result)
        with process_worker(concurrency=4, env=env):
            value = task.AsyncResult(owner).get(timeout=60)
            # every replaced message reached the worker and ended (skipped, not run)
            wait_idle(app, remote=True)
        assert _records("replace_latest") == [(7, value)]
        assert ids.index(owner) == value
        assert all(task.AsyncResult(t).state == REVOKED for t in replaced)


def test_replace_signal_and_running_holder(app: Any, store_name: str) -> None:
    """R1: a replacing dispatch sends unique_job_replaced (not unique_job_skipped) with
    observed=False and is published with its own arguments; while the holder runs,
    "replace" acts as "return"."""
    got: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    unique_job_replaced.connect(lambda **kw: got.append(kw), weak=False, dispatch_uid="r1")
    unique_job_skipped.connect(lambda **kw: skipped.append(kw), weak=False, dispatch_uid="r1s")
    try:
        task = jobs_flow.replace_latest
        first = task.delay(3, value=1)
        second = task.delay(3, value=2)
        assert not second.deduplicated
        assert [(g["replaced_id"], g["by_id"], g["observed"]) for g in got] == [
            (first.id, second.id, False)]
        assert skipped == []
        assert first.state == REVOKED
        with pytest.raises(TaskRevokedError, match=second.id):
            first.get(timeout=5)
        store, key = task.store(), task.job_key((3,), {})
        assert store.start(key, second.id, 60, now=clock.now(), release=False).run
        third = task.delay(3, value=3)
        assert third.deduplicated and third.id == second.id
    finally:
        unique_job_replaced.disconnect(dispatch_uid="r1")
        unique_job_skipped.disconnect(dispatch_uid="r1s")


# -- R2 -----------------------------------------------------------------------------------


@pytest.mark.parametrize("store", PROCESS_STORES)
def test_without_overlapping_five_dispatches_during_a_run(app: Any, store: str) -> None:
    """R2: a 3 s run on a prefork worker with 4 processes; 5 dispatches of its key during
    it. No two runs overlap (recorded start/end times), at most one extra run (the first
    dispatch made during the run waits, the others are deduplicated onto it), and every
    dispatch's result is ready."""
    dedup, _database, env = _dedup(store)
    with override_settings(DEDUP_JOBS=dedup):
        task = jobs_flow.no_overlap
        with process_worker(concurrency=4, env=env):
            first = task.delay(5, seconds=3, tag=0)
            wait_for(lambda: task.store().get(running_key(task.job_key((5,), {}))), 30)
            later = []
            for tag in range(1, 6):
                later.append(task.delay(5, seconds=0.2, tag=tag))
                time.sleep(0.3)
            results = [first, *later]
            for result in results:
                result.get(timeout=60)
        assert all(r.state in READY_STATES for r in results)
        runs = sorted(_records("no_overlap"), key=lambda r: r[2])
        assert 1 <= len(runs) - 1 <= 1, runs
        for before, after in itertools.pairwise(runs):
            assert before[3] <= after[2], f"runs overlap: {before} and {after}"
        assert runs[0][1] == 0 and runs[1][1] == 1  # the first later dispatch ran, after


@pytest.mark.redis
def test_without_overlapping_defers_with_a_signal(app: Any) -> None:
    """R2: a message reaching a worker during a run of its key is published again (same task
    id) and job_deferred (reason "overlap", until in epoch seconds, observed False) is sent;
    it keeps its lock while it waits, so a later dispatch is deduplicated onto it."""
    got: list[dict[str, Any]] = []
    job_deferred.connect(lambda **kw: got.append(kw), weak=False, dispatch_uid="r2")
    try:
        task = jobs_flow.no_overlap
        with thread_worker(app, pool="threads", concurrency=2):
            first = task.delay(6, seconds=2, tag=0)
            wait_for(lambda: task.store().get(running_key(task.job_key((6,), {}))), 20)
            second = task.delay(6, tag=1)
            wait_for(lambda: got, 20)
            third = task.delay(6, tag=2)
            assert third.deduplicated and third.id == second.id
            assert second.get(timeout=30) == 1 and first.get(timeout=30) == 0
        deferral = got[0]
        assert deferral["task_id"] == second.id and deferral["reason"] == "overlap"
        assert deferral["observed"] is False and deferral["until"] > time.time() - 5
    finally:
        job_deferred.disconnect(dispatch_uid="r2")


# -- R3 -----------------------------------------------------------------------------------


def test_observe_only_twenty_duplicates_all_run(app: Any, store_name: str) -> None:
    """R3: an observe-only job, 20 dispatches of one key before any worker runs: all 20 are
    published (.deduplicated False) and run; 19 unique_job_skipped signals, each with
    observed=True; the store records the lock it would hold (the first dispatch's)."""
    got: list[dict[str, Any]] = []
    unique_job_skipped.connect(lambda **kw: got.append(kw), weak=False, dispatch_uid="r3")
    try:
        task = jobs_flow.observed
        results = [task.delay(9) for _ in range(20)]
        assert [r.deduplicated for r in results] == [False] * 20
        assert task.store().get(task.job_key((9,), {})).owner == results[0].id  # type: ignore[union-attr]
        with thread_worker(app, pool="threads", concurrency=2):
            assert [r.get(timeout=30) for r in results] == [9] * 20
        assert len(jobs.runs("observed")) == 20
        assert len(got) == 19 and all(g["observed"] is True for g in got)
        assert {g["holder_id"] for g in got} == {results[0].id}
    finally:
        unique_job_skipped.disconnect(dispatch_uid="r3")


def test_observe_only_setting_replace_and_raise(app: Any, store_name: str) -> None:
    """R3: DEDUP_JOBS["OBSERVE_ONLY"] = True puts every job in observe-only mode: a
    "replace" job's replaced copy is reported (observed=True) but neither revoked nor kept
    from running; nothing is raised."""
    got: list[dict[str, Any]] = []
    unique_job_replaced.connect(lambda **kw: got.append(kw), weak=False, dispatch_uid="r3r")
    try:
        with override_settings(DEDUP_JOBS={**settings.DEDUP_JOBS, "OBSERVE_ONLY": True}):
            task = jobs_flow.replace_latest
            first, second = task.delay(4, value=1), task.delay(4, value=2)
            assert got[0]["observed"] is True and got[0]["replaced_id"] == first.id
            assert first.state != REVOKED
            with thread_worker(app):
                assert (first.get(timeout=30), second.get(timeout=30)) == (1, 2)
    finally:
        unique_job_replaced.disconnect(dispatch_uid="r3r")


# -- budgets (section 8) --------------------------------------------------------------------


@pytest.mark.redis
@override_settings(DEDUP_JOBS={"STORE": "redis"})
def test_redis_replace_and_overlap_decisions_are_one_round_trip(redis_client: Any) -> None:
    """R1, R2 / section 8, counted on the Redis server: a replacing dispatch is one EVALSHA;
    the without_overlapping worker check is one EVALSHA, whether it defers or admits; an
    admitted run pays one more at its end, the marker's release (as a UniqueJob's finish)."""
    load_scripts(jobs.unique_sleep.store())
    replace, overlap = jobs_flow.replace_latest, jobs_flow.no_overlap
    store, key = overlap.store(), overlap.job_key((1,), {})
    header = {HEADER: key.as_header("redis")}
    assert store.start_exclusive(key, running_key(key), "running-one", 60,
                                 now=clock.now()).run  # a run of the key is in progress
    with kombu.Connection(MEMORY) as memory:
        replace.apply_async((1,), connection=memory)
        assert delta(redis_client, lambda: replace.apply_async((1,), connection=memory)) == {
            "evalsha": 1}
        queued = overlap.apply_async((1,), connection=memory)
    answer: list[Any] = []
    assert delta(redis_client, lambda: answer.append(store.start_exclusive(
        key, running_key(key), queued.id, 60, now=clock.now()))) == {"evalsha": 1}
    assert answer[0].overlap and answer[0].holder == "running-one"
    store.release(running_key(key), "running-one")
    assert delta(redis_client, lambda: overlap.apply((1,), task_id=queued.id,
                                                     headers=header)) == {"evalsha": 2}
    assert store.get(key) is None and store.get(running_key(key)) is None


@pytest.mark.redis
@override_settings(DEDUP_JOBS={"STORE": "redis"})
def test_redis_cancel_decisions_are_one_round_trip(redis_client: Any) -> None:
    """L2 / section 8, counted on the Redis server: a cancel_running dispatch while a run is
    in progress is one EVALSHA (the lock taken, the run asked to stop), and so is the run's
    renewal that reads the request back: a cancel costs no call of its own."""
    load_scripts(jobs.unique_sleep.store())
    cancel = jobs_flow.cancel_latest
    store, key = cancel.store(), cancel.job_key((1,), {})
    with kombu.Connection(MEMORY) as memory:  # the take-over script loaded before counting
        cancel.apply_async((2,), connection=memory)
    assert store.acquire(key, "running-two", 60, now=clock.now()).acquired
    assert store.start_exclusive(key, running_key(key), "running-two", 60,
                                 now=clock.now()).run  # a run of the key is in progress
    with kombu.Connection(MEMORY) as memory:
        assert delta(redis_client, lambda: cancel.apply_async((1,), connection=memory)) == {
            "evalsha": 1}
    renewed: list[Any] = []
    assert delta(redis_client, lambda: renewed.append(store.renew(
        running_key(key), "running-two", 60, now=clock.now()))) == {"evalsha": 1}
    assert renewed[0].held and renewed[0].cancel is not None


@pytest.mark.postgres
@override_settings(DEDUP_JOBS={"STORE": "database", "DATABASE_ALIAS": "postgres"})
def test_postgres_take_over_is_one_statement() -> None:
    """R1 / section 8: on PostgreSQL a replacing dispatch is one statement, free or not."""
    store = get_store("database")
    key = jobs_flow.replace_latest.job_key((1,), {})
    for owner, replaced in (("owner-1", None), ("owner-2", "owner-1")):
        with CaptureQueriesContext(connections["postgres"]) as queries:
            answer = store.take_over(key, owner, 60, now=clock.now())
        assert answer.acquired and answer.replaced == replaced and len(queries) == 1
