"""Unique Django tasks on django-tasks-rq's RQBackend with a real ``rqworker`` (SPEC K3): the
jobs queue on a Redis database of their own, the worker forks a work horse per job (rq's
default) and runs it through ``Task.call``, where the worker-side check lives; the locks sit
in the database store (SQLite), the runs are recorded in Redis by the bodies."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
import redis
from django.conf import settings
from rq.job import Job

from dedup_jobs.stores.base import new_request_id
from tests import jobs
from tests.conftest import need
from tests.test_django_tasks_workers import ROOT, Site, enqueue, go, running, until, worker_process

#: the rq queue's database on the tests' Redis (9-12 are the locks, broker, results, runs)
RQ_DB = 13

#: in the slow matrix (``uv run pytest -m matrix``): real rq workers, ~40 s of the README's
#: command; the db_worker suites (tests/test_django_tasks_workers.py) stay in it
pytestmark = [pytest.mark.usefixtures("_rq_db"), pytest.mark.matrix]


@dataclass
class RQSite(Site):
    """SQLite for the locks, the "rq" backend for every task of tests/django_tasks_jobs.py
    that follows DEDUP_TASKS_BACKEND."""

    rq: str = ""

    def env(self, **more: str) -> dict[str, str]:
        return super().env(DEDUP_TASKS_RQ=self.rq, DEDUP_TASKS_BACKEND="rq",
                             DEDUP_TASKS_DEFER_BACKEND="rq", **more)

    def queue(self) -> redis.Redis:
        return redis.Redis.from_url(self.rq)

    def statuses(self) -> dict[str, str]:
        """rq job id -> its status, for every job rq keeps."""
        client = self.queue()
        found = {}
        for name in client.scan_iter("rq:job:*"):
            key = name.decode()
            if key.count(":") == 2:  # rq:job:<id>, not rq:job:<id>:dependents etc.
                status = client.hget(key, "status")
                found[key.rsplit(":", 1)[1]] = status.decode() if status else ""
        return found


@pytest.fixture
def _rq_db() -> None:
    need("redis")
    redis.Redis.from_url(f"{settings.REDIS_URL}/{RQ_DB}").flushdb()


@pytest.fixture(scope="module")
def rq_site(tmp_path_factory: pytest.TempPathFactory) -> RQSite:
    spec = f"sqlite:{tmp_path_factory.mktemp('rq') / 'locks.sqlite3'}"
    built = RQSite(spec, rq=f"{settings.REDIS_URL}/{RQ_DB}")
    subprocess.run([sys.executable, "-m", "django", "migrate", "-v", "0"], cwd=ROOT,
                   env=built.env(), check=True, timeout=120)
    return built


@pytest.fixture
def site(rq_site: RQSite) -> RQSite:
    """The site with no locks left."""
    import sqlite3

    with sqlite3.connect(rq_site.spec.partition(":")[2], timeout=30) as db:
        db.execute("DELETE FROM dedup_jobs_joblock")
    return rq_site


@contextmanager
def rq_worker(site: RQSite) -> Iterator[subprocess.Popen[bytes]]:
    """A real ``rqworker`` on the "default" queue, with django-tasks-rq's job class (its
    README's command); SIGKILLed with its work horses at the end."""
    with worker_process(site, "rq-worker", "rqworker", "default", "--with-scheduler",
                        "--job-class", "django_tasks_rq.Job",
                        "--name", f"dedup-{new_request_id()[:12]}") as proc:
        yield proc


def settled(site: RQSite, ids: list[str], timeout: float = 60.0) -> dict[str, str]:
    """The statuses of every job, once each of ``ids`` is finished or failed."""
    def done() -> dict[str, str] | None:
        found = site.statuses()
        return found if all(found.get(i) in ("finished", "failed") for i in ids) else None

    answer: dict[str, str] = until(done, timeout)
    return answer


def test_sixteen_enqueuers_leave_one_job_and_one_run(site: RQSite) -> None:
    """4 processes x 4 threads enqueue one key while no worker runs: rq keeps one job (the
    duplicates' jobs, queued before the lock was asked, are taken back); every answer
    carries its id; the worker runs it once, and the lock goes with the run."""
    answers = enqueue(site, "indexed", 41, threads=4, processes=4)
    jobs_ = site.statuses()
    assert list(jobs_.values()) == ["queued"], jobs_
    (holder,) = jobs_
    assert {a["id"] for a in answers} == {holder}
    assert sorted(a["deduplicated"] for a in answers) == [False] + [True] * 15
    with rq_worker(site):
        assert settled(site, [holder])[holder] == "finished"
        (again,) = enqueue(site, "indexed", 41)
        assert again["deduplicated"] is False and again["id"] != holder
        assert settled(site, [again["id"]])[again["id"]] == "finished"
    assert jobs.runs("indexed:41") == ["41", "41"]


def test_released_after_success_and_failure(site: RQSite) -> None:
    with rq_worker(site):
        for _ in (1, 2):
            (ok,) = enqueue(site, "indexed", 42)
            (bad,) = enqueue(site, "failing", "r")
            assert not ok["deduplicated"] and not bad["deduplicated"]
            found = settled(site, [ok["id"], bad["id"]])
            assert (found[ok["id"]], found[bad["id"]]) == ("finished", "failed")
    assert jobs.runs("indexed:42") == ["42", "42"]
    assert jobs.runs("failing:r") == ["'r'", "'r'"]


def test_a_duplicate_while_running_returns_the_holder(site: RQSite) -> None:
    with rq_worker(site):
        (first,) = enqueue(site, "held", "q")
        until(lambda: running("q"))
        (duplicate,) = enqueue(site, "held", "q")
        assert duplicate == {"id": first["id"], "deduplicated": True}
        assert set(site.statuses()) == {first["id"]}
        go("q")
        assert settled(site, [first["id"]])[first["id"]] == "finished"
    assert jobs.runs("held:q") == ["'q'"]


def test_a_job_around_the_decorator_is_not_run_while_another_holds(site: RQSite) -> None:
    """W3 on rq: a job queued with the backend's own enqueue (no lock) while the holder
    runs fails with DuplicateJob in its work horse; its body never runs."""
    with rq_worker(site), rq_worker(site):
        (holder,) = enqueue(site, "held", "w")
        until(lambda: running("w"))
        (bypass,) = enqueue(site, "held", "w", extra=("--bypass",))
        assert settled(site, [bypass["id"]])[bypass["id"]] == "failed"
        failure = Job.fetch(bypass["id"], connection=site.queue()).latest_result()
        assert failure is not None and failure.exc_string is not None
        assert "DuplicateJob" in failure.exc_string and holder["id"] in failure.exc_string
        go("w")
        assert settled(site, [holder["id"]])[holder["id"]] == "finished"
    assert jobs.runs("held:w") == ["'w'"]


def test_ten_debounced_enqueues_leave_one_scheduled_job_run_once(site: RQSite) -> None:
    """K2/D1 on rq: 10 enqueues of one key within debounce_for (2 s) leave one job (the
    absorbed ones' jobs deleted), whose id every enqueue returned; rq's scheduler moves it
    to the queue when its run_after passes, and it runs once with the last enqueue's
    arguments. (Read right after the enqueuing process ends, the job is "scheduled"; on a
    loaded machine its run_after may have passed by then, and it is on its way.)"""
    with rq_worker(site):
        answers = enqueue(site, "debounced_tail", "r", count=10)
        found = site.statuses()
        assert len(found) == 1 and set(found.values()) <= {
            "scheduled", "queued", "started", "finished"}, found
        (burst,) = found
        assert [a["id"] for a in answers] == [burst] * 10
        assert [a["deduplicated"] for a in answers] == [False] + [True] * 9
        assert settled(site, [burst])[burst] == "finished"
    assert jobs.runs("debounced_tail:r") == ["9"]
