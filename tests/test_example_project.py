"""The example project and its ``demo`` command, run as a new user runs them: ``python
manage.py ...`` in a subprocess from the repository root, on a throw-away SQLite file."""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

ROOT = Path(__file__).resolve().parent.parent

UNIQUE_FIGURES = "dispatched 200, published 1, deduplicated 199, ran 1, lock released"
UNTIL_PROCESSING_FIGURES = (
    "dispatched 6, published 2, deduplicated 4, ran 2 (2 emails sent); "
    "the dispatch during processing was published"
)


def manage(
    *args: str, db: Path, redis: str | None = None, timeout: float = 90
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEDUP_JOBS_EXAMPLE_")}
    env.update(
        DJANGO_SETTINGS_MODULE="example_project.settings",
        DEDUP_JOBS_EXAMPLE_DB=str(db),
        PYTHONUNBUFFERED="1",
    )
    if redis:
        env["DEDUP_JOBS_EXAMPLE_REDIS"] = redis
        env["DEDUP_JOBS_EXAMPLE_QUEUE"] = (
            os.environ.get("DEDUP_JOBS_TEST_QUEUE", "dedup_tests") + "-example"
        )
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def query(db: Path, sql: str) -> list[tuple[object, ...]]:
    with sqlite3.connect(db) as connection:
        return connection.execute(sql).fetchall()


def assert_ok(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    assert "Traceback" not in result.stderr, result.stderr


def part(output: str, number: int) -> str:
    """The text of part ``number`` of the demo's output."""
    match = re.search(rf"^{number}\. .*?(?=^\d\. |^Done in)", output, re.M | re.S)
    assert match, f"part {number} missing from:\n{output}"
    return match.group(0)


def test_demo_on_embedded_defaults(tmp_path: Path) -> None:
    """U1, U2, U3, U4, P1: on a fresh clone's defaults (SQLite, database store, in-memory
    broker, in-process worker, no Redis) the demo migrates its own database, and 8 threads x
    25 dispatches of one key publish 1 message that runs once and releases its lock; the
    until-processing job dedups while queued and publishes a dispatch made while it runs.
    D1, D3, D4, D6: 20 debounced dispatches run once, with the last one's arguments, every
    AsyncResult resolving to that run, with a bounded handful of messages. R1: of 5 prices
    dispatched while queued, 4 are replaced (results REVOKED) and only the latest runs. R2:
    with two workers, triggers sent during a sync wait for it (job_deferred) and run after
    it, never beside it, the later ones deduplicated onto the waiting one. L1: a per-plan
    concurrency() keeps "free" exports one at a time and lets "vip" ones run side by side,
    none of them waiting for a slot. K1-K3: 8 threads
    enqueueing one Django task write one row, which a real db_worker runs once; the next
    enqueue runs again. The printed figures agree with the database the demo wrote."""
    db = tmp_path / "demo.sqlite3"
    result = manage("demo", db=db)
    assert_ok(result)
    out = result.stdout

    unique = part(out, 1)
    assert UNIQUE_FIGURES in unique, out
    assert len(re.findall(r"lock acquired by task", unique)) == 1, out
    assert len(re.findall(r"message published for task", unique)) == 1, out
    assert len(re.findall(r"released \(success\)", unique)) == 1, out
    # in the order it happens: the lock is taken, then the message published, then run
    order = [unique.index(event) for event in (
        "lock acquired by task", "message published for task", "worker started task")]
    assert order == sorted(order), unique
    assert "a duplicate returned 'indexed product 42'" in unique, out
    assert "(1 distinct id)" in unique, out

    until = part(out, 2)
    assert UNTIL_PROCESSING_FIGURES in until, out
    # One release at the start of each published run, each line naming its dispatch: the
    # first (1 of 6) and the one made while it ran (6 of 6); a lock released twice, or a
    # line printed twice, would repeat a number.
    assert re.findall(r"lock of task \w+ \(dispatch (\d)\) released \(processing\)",
                      until) == ["1", "6"], out
    assert "Done in" in out

    debounce = part(out, 3)
    assert "dispatched 20, superseded 19, messages published" in debounce, out
    assert "ran 1, with the last arguments (edit=20)" in debounce, out
    published = int(re.search(r"messages published (\d+)", debounce).group(1))  # type: ignore[union-attr]
    assert 1 <= published <= 3, out
    assert "all 20 dispatches' AsyncResults resolved to the one run" in debounce, out

    replace = part(out, 4)
    assert "dispatched 5, replaced 4 (4 results REVOKED), ran 1, with the latest price: " \
        "'product 42 repriced to 13.25'; price in the database: 13.25" in replace, out
    assert len(re.findall(r"\(unique_job_replaced\)", replace)) == 4, out
    assert len(re.findall(r"worker started task", replace)) == 1, out

    overlap = part(out, 5)
    assert "dispatched 4, published 2, deduplicated 2, deferred " in overlap, out
    assert "ran 2, overlapping runs 0" in overlap, out
    assert "(job_deferred, reason 'overlap')" in overlap, out

    per_plan = re.search(r"vip: most at once (\d+), waited for a slot (\d+); free: most at "
                         r"once (\d+), waited for a slot (\d+)", part(out, 6))
    assert per_plan, out
    vip_at_once, vip_waited, free_at_once, free_waited = map(int, per_plan.groups())
    assert (vip_at_once, vip_waited, free_at_once) == (2, 0, 1) and free_waited >= 1, out

    django_tasks = part(out, 7)  # K1-K3: @unique over a Django @task, django-tasks-db
    assert "enqueued 8, task rows written 1, deduplicated 7 (1 distinct result id)" \
        in django_tasks, out
    assert "1 successful row;" in django_tasks and "(deduplicated False)" in django_tasks
    assert "2 successful rows" in django_tasks, out
    assert query(db, "SELECT status, count(*) FROM django_tasks_database_dbtaskresult "
                     "GROUP BY status") == [("SUCCESSFUL", 2)]

    # Independent of the printout: what the jobs wrote, and no lock left behind.
    assert query(db, "SELECT index_runs FROM shop_product WHERE id = 42") == [(1,)]
    assert query(db, "SELECT confirmations_sent FROM shop_order WHERE id = 7") == [(2,)]
    # a released lock's row stays as its tombstone (S7: a re-sent release answers as the
    # first), nonce "released" and expired; no row is a lock any more
    assert query(db, "SELECT count(*) FROM dedup_jobs_joblock WHERE nonce <> 'released'") \
        == [(0,)]
    assert query(db, "SELECT rebuilds, last_edit FROM shop_productfeed") == [(1, 20)]
    assert query(db, "SELECT price, reprice_runs FROM shop_product WHERE id = 42") == [
        (13.25, 1)]
    runs = query(db, "SELECT trigger, started_at, finished_at FROM shop_stocksync "
                     "ORDER BY started_at")
    assert [trigger for trigger, _s, _f in runs] == [1, 2], runs
    assert runs[0][2] <= runs[1][1], runs  # the second sync began after the first ended


@pytest.mark.matrix  # two more demo runs (~25 s): the slow matrix step of CI
def test_demo_runs_again_on_the_same_database(tmp_path: Path) -> None:
    """U1, U4: a second demo on the same database starts clean (locks were released, data is
    updated in place) and takes its burst size from the command line."""
    db = tmp_path / "demo.sqlite3"
    assert_ok(manage("demo", "--threads", "2", "--per-thread", "5", db=db))
    result = manage("demo", "--threads", "3", "--per-thread", "4", db=db)
    assert_ok(result)
    assert "dispatched 12, published 1, deduplicated 11, ran 1, lock released" in result.stdout
    assert "left by an earlier run" not in result.stdout
    assert query(db, "SELECT index_runs FROM shop_product WHERE id = 42") == [(2,)]
    assert query(db, "SELECT confirmations_sent FROM shop_order WHERE id = 7") == [(4,)]
    assert query(db, "SELECT rebuilds, last_edit FROM shop_productfeed") == [(2, 20)]
    assert query(db, "SELECT reprice_runs FROM shop_product WHERE id = 42") == [(2,)]


@pytest.mark.matrix  # a second demo run: in the slow matrix
def test_demo_runs_after_a_dispatch_whose_message_was_lost(tmp_path: Path) -> None:
    """D9, issue 21 case 8: a dispatch from a shell on the example project's in-memory
    broker leaves a burst whose message ended with the shell; the demo clears the state of
    all its parts before it starts, so it runs as on a fresh database."""
    db = tmp_path / "demo.sqlite3"
    assert_ok(manage("migrate", "--verbosity", "0", db=db))
    shell = manage("shell", "-c", "from example_project.shop.tasks import rebuild_product_feed; "
                   "print(rebuild_product_feed.delay('mugs', edit=0).id)", db=db)
    assert_ok(shell)
    assert query(db, "SELECT count FROM dedup_jobs_pendingdebounce") == [(1,)]
    result = manage("demo", db=db)
    assert_ok(result)
    assert "released a debounce burst left by an earlier run" in result.stdout
    assert query(db, "SELECT rebuilds, last_edit FROM shop_productfeed") == [(1, 20)]


@pytest.mark.redis
@pytest.mark.matrix  # the demo once more, on Redis (~12 s): the slow matrix step of CI
def test_demo_on_redis(tmp_path: Path) -> None:
    """U3, S1: with DEDUP_JOBS_EXAMPLE_REDIS the same demo runs on the django-redis store and
    a Redis broker, with the same figures."""
    result = manage("demo", db=tmp_path / "demo.sqlite3", redis=settings.REDIS_URL)
    assert_ok(result)
    assert "locks:  cache 'locks' at redis://" in result.stdout
    assert UNIQUE_FIGURES in result.stdout, result.stdout
    assert UNTIL_PROCESSING_FIGURES in result.stdout, result.stdout


def test_demo_never_hangs(tmp_path: Path) -> None:
    """The demo's own contract (no SPEC rule): past --timeout it stops with exit status 3 and
    says why, whatever it was waiting for."""
    result = manage("demo", "--timeout", "0.3", db=tmp_path / "demo.sqlite3")
    assert result.returncode == 3, result.stdout + result.stderr
    assert "gave up after 0.3s (--timeout)" in result.stderr


def test_demo_refuses_a_bad_burst_size(tmp_path: Path) -> None:
    """The demo's own contract (no SPEC rule): a bad option value is named in the error,
    with a non-zero exit and no traceback."""
    result = manage("demo", "--threads", "0", db=tmp_path / "demo.sqlite3")
    assert result.returncode != 0
    assert "'0' must be a whole number of at least 1" in result.stderr
    assert "Traceback" not in result.stderr


def test_example_project_checks_and_migrations(tmp_path: Path) -> None:
    """A3: the example project passes Django's system checks (warnings included) once
    migrated; before, the database store's check names the missing table; its migrations
    match its models."""
    db = tmp_path / "check.sqlite3"
    before = manage("check", "--database", "default", "--fail-level", "WARNING", db=db)
    assert before.returncode != 0
    assert "dedup_jobs.W003" in before.stderr
    # "migrate" runs the database checks before it migrates: the tables it is about to
    # create are not reported missing (no W003 on a fresh database), and nothing refuses it.
    migrated = manage("migrate", db=db)
    assert_ok(migrated)
    assert "Applying dedup_jobs.0001_initial... OK" in migrated.stdout, migrated.stdout
    assert "System check identified" not in migrated.stdout + migrated.stderr, migrated.stderr
    result = manage("check", "--database", "default", "--fail-level", "WARNING", db=db)
    assert_ok(result)
    assert "System check identified no issues" in result.stdout
    assert_ok(manage("makemigrations", "--check", "--dry-run", db=db))
