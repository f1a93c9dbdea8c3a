"""Unique Django tasks on django-tasks-db's DatabaseBackend with real ``db_worker``
processes, on SQLite and PostgreSQL (SPEC K3): enqueuers in processes of their own, the
task rows read straight from the database, runs recorded in Redis by the bodies."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dedup_jobs.stores.base import new_request_id
from tests import jobs
from tests.settings import PG_HOST

ROOT = Path(__file__).resolve().parent.parent
TABLE = "django_tasks_database_dbtaskresult"


@dataclass
class Site:
    """One database of task rows, and the environment of the processes using it."""

    spec: str  # DEDUP_TASKS_DB

    def env(self, **more: str) -> dict[str, str]:
        return {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings_django_tasks",
                "DEDUP_TASKS_DB": self.spec, **more}

    def rows(self) -> dict[str, tuple[str, str]]:
        """id -> (status, traceback) of every task row."""
        kind, _, name = self.spec.partition(":")
        query = f"SELECT id, status, traceback FROM {TABLE}"
        if kind == "sqlite":
            with sqlite3.connect(name, timeout=30) as db:
                found = db.execute(query).fetchall()
        else:
            import psycopg

            with psycopg.connect(host=PG_HOST, user="postgres", dbname=name) as db:
                found = db.execute(query).fetchall()
        return {str(uuid.UUID(str(pk))): (status, tb) for pk, status, tb in found}


def _recreate(spec: str, *, create: bool) -> None:
    """Drop the PostgreSQL database of ``spec`` (and create it anew)."""
    kind, _, name = spec.partition(":")
    if kind != "postgres":
        return
    import psycopg

    with psycopg.connect(host=PG_HOST, user="postgres", dbname="postgres",
                         autocommit=True) as db:
        db.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if create:
            db.execute(f'CREATE DATABASE "{name}"')


#: PostgreSQL runs in the slow matrix step (uv run pytest -m matrix), SQLite in the README's
#: test command: the same tests, with db_worker processes on each
@pytest.fixture(scope="module", params=[
    "sqlite", pytest.param("postgres", marks=[pytest.mark.postgres, pytest.mark.matrix])])
def site(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
         ) -> Iterator[Site]:
    if request.param == "sqlite":
        spec = f"sqlite:{tmp_path_factory.mktemp('tasks') / 'tasks.sqlite3'}"
    else:
        spec = f"postgres:dedup_tasks_{os.getpid()}"
    _recreate(spec, create=True)
    built = Site(spec)
    subprocess.run([sys.executable, "-m", "django", "migrate", "-v", "0"], cwd=ROOT,
                   env=built.env(), check=True, timeout=120)
    try:
        yield built
    finally:
        _recreate(spec, create=False)


@pytest.fixture
def fresh(site: Site) -> Site:
    """The site with no task rows (and, with the database store, no locks) left."""
    kind, _, name = site.spec.partition(":")
    tables = [TABLE, "dedup_jobs_joblock"]
    if kind == "sqlite":
        with sqlite3.connect(name, timeout=30) as db:
            for table in tables:
                db.execute(f"DELETE FROM {table}")
    else:
        import psycopg

        with psycopg.connect(host=PG_HOST, user="postgres", dbname=name) as db:
            for table in tables:
                db.execute(f"DELETE FROM {table}")
    return site


def enqueue(site: Site, task: str, *args: Any, threads: int = 1, processes: int = 1,
            count: int = 0, extra: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Enqueue from ``processes`` processes of ``threads`` threads each (or ``count`` times
    in a row, with 0..count-1 appended to the arguments); their answers."""
    cmd = [sys.executable, "-m", "tests.django_tasks_enqueue", task, json.dumps(list(args)),
           "--threads", str(threads), "--count", str(count), *extra]
    procs = [subprocess.Popen(cmd, cwd=ROOT, env=site.env(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(processes)]
    answers = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        answers += [json.loads(line) for line in out.splitlines()]
    assert len(answers) == max(threads, count) * processes
    return answers


@contextmanager
def worker_process(site: Site, name: str, *args: str,
                   **env: str) -> Iterator[subprocess.Popen[bytes]]:
    """``python -m django *args`` (a worker) in a session of its own, logged to
    ``.<name>-<pid>.log``; SIGKILLed with its children at the end if still alive."""
    log = open(ROOT / f".{name}-{os.getpid()}.log", "ab")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "django", *args], cwd=ROOT,
                            env=site.env(**env), stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        log.close()


@contextmanager
def db_worker(site: Site, backend: str = "default",
              **env: str) -> Iterator[subprocess.Popen[bytes]]:
    """A real ``db_worker`` process for ``backend``."""
    with worker_process(site, "db-worker", "db_worker", "--interval", "0.05",
                        "--no-startup-delay", "--worker-id", new_request_id()[:20],
                        "--backend", backend, **env) as proc:
        yield proc


def until(what: Callable[[], Any], timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = what()
        if found:
            return found
        assert time.monotonic() < deadline, f"not within {timeout}s"
        time.sleep(0.05)


def finished(site: Site, count: int) -> dict[str, tuple[str, str]]:
    """The rows, once ``count`` of them are finished."""
    def done() -> dict[str, tuple[str, str]] | None:
        rows = site.rows()
        ended = [r for r in rows.values() if r[0] in ("SUCCESSFUL", "FAILED")]
        return rows if len(ended) >= count else None

    found: dict[str, tuple[str, str]] = until(done)
    return found


def go(token: str) -> None:
    jobs.runs_client().set(f"go:{token}", "1")


def running(token: str) -> bool:
    return bool(jobs.runs_client().exists(f"running:{token}"))


def test_one_row_and_one_run_from_sixteen_enqueuers(fresh: Site) -> None:
    """4 processes x 4 threads enqueue one key while nothing runs: one row; every other
    enqueue returned that row's result, marked deduplicated; a worker runs it once."""
    answers = enqueue(fresh, "indexed", 31, threads=4, processes=4)
    rows = fresh.rows()
    assert len(rows) == 1, rows
    (holder,) = rows
    assert {a["id"] for a in answers} == {holder}
    assert sorted(a["deduplicated"] for a in answers) == [False] + [True] * 15
    with db_worker(fresh):
        assert finished(fresh, 1)[holder][0] == "SUCCESSFUL"
    assert jobs.runs("indexed:31") == ["31"]


def test_released_after_success_and_failure(fresh: Site) -> None:
    """K2: the lock goes when the task ends, succeeded or failed; the next enqueue runs."""
    with db_worker(fresh):
        for round_ in (1, 2):
            (ok,) = enqueue(fresh, "indexed", 32)
            (bad,) = enqueue(fresh, "failing", "t")
            assert not ok["deduplicated"] and not bad["deduplicated"]
            rows = finished(fresh, 2 * round_)
            assert rows[ok["id"]][0] == "SUCCESSFUL"
            assert rows[bad["id"]][0] == "FAILED" and "failing t" in rows[bad["id"]][1]
    assert jobs.runs("indexed:32") == ["32", "32"]
    assert jobs.runs("failing:t") == ["'t'", "'t'"]


def test_until_processing_lets_a_dispatch_during_the_run_through(fresh: Site) -> None:
    with db_worker(fresh):
        (first,) = enqueue(fresh, "until_processing_held", "u", "first")
        until(lambda: running("u:first"))
        (second,) = enqueue(fresh, "until_processing_held", "u", "second")
        assert second["deduplicated"] is False and second["id"] != first["id"]
        (third,) = enqueue(fresh, "until_processing_held", "u", "third")
        assert third == {"id": second["id"], "deduplicated": True}  # second is queued
        go("u:first")
        until(lambda: running("u:second"))
        go("u:second")
        rows = finished(fresh, 2)
    assert {rows[first["id"]][0], rows[second["id"]][0]} == {"SUCCESSFUL"}
    assert jobs.runs("until_processing_held:u") == ["'first'", "'second'"]


def test_a_row_around_the_decorator_is_not_run_while_another_holds(fresh: Site) -> None:
    """W3: a row enqueued with the backend's own enqueue (no lock) while another result
    holds the key fails with DuplicateJob, naming the holder; its body never runs (a
    second worker picks the row while the first runs the holder)."""
    with db_worker(fresh), db_worker(fresh):
        (holder,) = enqueue(fresh, "held", "b")
        until(lambda: running("b"))
        (bypass,) = enqueue(fresh, "held", "b", extra=("--bypass",))
        rows = until(lambda: (r := fresh.rows()) and r[bypass["id"]][0] == "FAILED" and r)
        assert "DuplicateJob" in rows[bypass["id"]][1] and holder["id"] in rows[bypass["id"]][1]
        go("b")
        assert finished(fresh, 2)[holder["id"]][0] == "SUCCESSFUL"
    assert jobs.runs("held:b") == ["'b'"]


def test_a_killed_worker_frees_the_lock_within_the_lease(fresh: Site) -> None:
    """W6: SIGKILL the db_worker running the task: its lease stops, the lock expires
    within LEASE_SECONDS (3 s here), and the next enqueue is not deduplicated."""
    lease = 3.0
    with db_worker(fresh, DEDUP_TASKS_LEASE=str(lease)) as worker:
        (first,) = enqueue(fresh, "held", "k")
        until(lambda: running("k"))
        time.sleep(lease)  # renewed meanwhile: the lock outlives its first lease
        (duplicate,) = enqueue(fresh, "held", "k")
        assert duplicate == {"id": first["id"], "deduplicated": True}
        os.killpg(worker.pid, signal.SIGKILL)
        killed = time.monotonic()
        worker.wait(timeout=30)
    env = {"DEDUP_TASKS_LEASE": str(lease)}
    while True:
        cmd = [sys.executable, "-m", "tests.django_tasks_enqueue", "held",
               json.dumps(["k"])]
        out = subprocess.run(cmd, cwd=ROOT, env=fresh.env(**env), capture_output=True,
                             text=True, check=True, timeout=60).stdout
        if not json.loads(out)["deduplicated"]:
            break
        assert time.monotonic() - killed < lease + 1.0, "the lock outlived the lease"
        time.sleep(0.1)


def test_an_enqueuer_killed_between_lock_and_commit_leaves_neither(fresh: Site) -> None:
    """The atomic enqueue, by a real fault: the enqueuing process dies after the row and
    the lock were written in its transaction, before the commit. Neither stays; the next
    enqueue takes the key."""
    cmd = [sys.executable, "-m", "tests.django_tasks_enqueue", "indexed", "[33]",
           "--pause-after-lock"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=fresh.env(), stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "locked"
    proc.kill()
    proc.wait(timeout=30)
    assert fresh.rows() == {}
    (next_,) = enqueue(fresh, "indexed", 33)
    assert next_["deduplicated"] is False
    assert list(fresh.rows()) == [next_["id"]]


def test_ten_debounced_enqueues_run_once_with_the_last_arguments(fresh: Site) -> None:
    """K2/D1: 10 enqueues of one key within debounce_for (2 s): one task row, whose result
    every enqueue returned; it runs once, with the last enqueue's arguments, and finishes.
    The worker is up from the start: it meets the row when its first run_after passes and
    waits for the burst's later due time."""
    with db_worker(fresh, backend="db"):
        answers = enqueue(fresh, "debounced_tail", "k", count=10)
        rows = fresh.rows()
        assert len(rows) == 1, rows
        (burst,) = rows
        assert [a["id"] for a in answers] == [burst] * 10
        assert [a["deduplicated"] for a in answers] == [False] + [True] * 9
        assert finished(fresh, 1)[burst][0] == "SUCCESSFUL"
    assert jobs.runs("debounced_tail:k") == ["9"]


def test_throttled_calls_wait_their_turn_and_none_is_dropped(fresh: Site) -> None:
    """K2/T2: concurrency=1 on one throttle key, two workers. While a runs, b and c are
    admitted nowhere: each deferral enqueues the same call again (run_after) and ends its
    own result FAILED with TaskDeferred, naming the new one. Then all three run, one at a
    time, each exactly once."""
    lease = {"DEDUP_TASKS_LEASE": "3"}  # a deferred call is retried within a second or so
    with db_worker(fresh, backend="db", **lease), db_worker(fresh, backend="db", **lease):
        enqueue(fresh, "throttled_held", "t", "a")
        until(lambda: running("t:a"))
        enqueue(fresh, "throttled_held", "t", "b")
        enqueue(fresh, "throttled_held", "t", "c")

        def deferred() -> list[str]:
            return [tb for status, tb in fresh.rows().values()
                    if status == "FAILED" and "TaskDeferred" in tb]

        found = until(lambda: len(deferred()) >= 4 and deferred())
        assert all("enqueued again as task" in tb for tb in found)
        assert not running("t:b") and not running("t:c")
        for token in "abc":
            go(f"t:{token}")
        # (a bound, not a wait: under the matrix's load on 2 cores the three turns took over 30 s)
        until(lambda: len(jobs.runs("throttled_held:t")) == 6, timeout=90)
    records = [r.strip("'") for r in jobs.runs("throttled_held:t")]
    starts = [r for r in records if r.endswith(":start")]
    assert sorted(starts) == ["a:start", "b:start", "c:start"], records
    for at in range(0, 6, 2):  # never two at once: each start is followed by its own end
        assert records[at + 1] == records[at].replace(":start", ":end"), records
