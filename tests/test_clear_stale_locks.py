"""``manage.py clear_stale_locks`` (SPEC A2) on django-redis and the database store, with a
real broker, result backend and worker."""

from __future__ import annotations

import io
import time
from collections.abc import Iterator
from typing import Any

import pytest
from celery import states
from django.conf import settings
from django.core.management import CommandError, call_command
from django.test import override_settings

from dedup_jobs import clock
from dedup_jobs.keys import build_key
from dedup_jobs.signals import lock_released
from dedup_jobs.stores import get_store
from tests import admin_helpers, jobs
from tests.admin_helpers import fill, unreachable_redis
from tests.workers import thread_worker, wait_for

listed_store = admin_helpers.listed_store_workers  # django-redis and SQLite; the rest: -m matrix

pytestmark = [pytest.mark.redis]


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("clear_stale_locks", *args, "--inspect-timeout", "0.3", "-v", "2", stdout=out)
    return out.getvalue()


def lock(args: tuple[Any, ...]) -> Any:
    return jobs.unique_sleep.store().get(jobs.unique_sleep.job_key(args, {}))


@pytest.fixture
def released() -> Iterator[list[dict[str, Any]]]:
    seen: list[dict[str, Any]] = []

    def on_release(sender: Any, **kwargs: Any) -> None:
        seen.append(kwargs)

    lock_released.connect(on_release, weak=False)
    yield seen
    lock_released.disconnect(on_release)


def test_finished_owner_is_removed_pending_owner_kept(
    app: Any, listed_store: str, released: list[dict[str, Any]]
) -> None:
    """A2: a lock whose owner task finished (result backend: SUCCESS) is removed, with
    lock_released(reason="command"); a lock whose message still waits is kept; --dry-run
    lists without removing."""
    with thread_worker(app):
        done = jobs.unique_sleep.delay(1)
        assert done.get(timeout=20) == 1
    key = jobs.unique_sleep.job_key((1,), {})
    # The finished task's lock left behind (as if its release had failed):
    assert get_store(listed_store).acquire(key, done.id, 600, now=clock.now()).acquired
    pending = jobs.unique_sleep.delay(2)
    dry = run("--dry-run")
    assert f"would remove tests.unique_sleep[item=1,seconds=0.0] in '{listed_store}'" in dry
    assert "would remove 1" in dry and "owner pending 1" in dry
    assert lock((1,)) is not None
    out = run()
    assert "owner task finished (SUCCESS)" in out and "removed 1" in out
    assert lock((1,)) is None
    assert lock((2,)).owner == pending.id
    by_command = [r for r in released if r["reason"] == "command"]
    assert [(r["owner"], r["store"]) for r in by_command] == [(done.id, listed_store)]


def test_running_lock_is_never_removed(app: Any, listed_store: str) -> None:
    """A2: the lock of a running job stays, even with --all --yes and even if the result
    backend already has a final state for its id (a manual re-send of a finished task)."""
    with thread_worker(app):
        result = jobs.unique_sleep.delay(3, seconds=3)
        wait_for(lambda: lock((3, 3)) is not None and lock((3, 3)).state == "running")
        app.backend.store_result(result.id, 3, states.SUCCESS)
        out = run()
        assert "running 1" in out and lock((3, 3)) is not None
        out = run("--all", "--yes")
        assert "removed 0" in out and "running 1" in out
        assert lock((3, 3)).owner == result.id
        assert result.get(timeout=20) == 3


def test_all_removes_every_queued_lock(listed_store: str, released: list[dict[str, Any]]) -> None:
    """A2: --all --yes removes every queued lock of the chosen job; --job narrows."""
    fill(listed_store, 3)
    other = build_key("unique", "tests.unique_add", "a=1")
    assert get_store(listed_store).acquire(other, "owner-add", 600, now=clock.now()).acquired
    out = run("--all", "--yes", "--job", "tests.unique_sleep")
    assert "3 held locks scanned: removed 3" in out
    assert get_store(listed_store).get(other) is not None
    assert {r["reason"] for r in released} == {"command"} and len(released) == 3


def test_older_than_removes_only_owners_nowhere_to_be_seen(listed_store: str) -> None:
    """A2: with --older-than, an old lock whose owner no worker reports and no queue holds is
    removed; an equally old lock whose message waits in the broker queue is kept; a young
    one is kept. (Real time: the Redis store dates locks by the server's clock.)"""
    queued = jobs.unique_sleep.delay(5)  # its message waits on the queue
    ghost = build_key("unique", "tests.unique_sleep", "item=6")
    assert get_store(listed_store).acquire(ghost, "ghost-owner", 600, now=clock.now()).acquired
    time.sleep(1.3)
    young = build_key("unique", "tests.unique_sleep", "item=7")
    assert get_store(listed_store).acquire(young, "young-owner", 600, now=clock.now()).acquired
    out = run("--older-than", "1")
    assert "older than 1 s, owner not on any worker or queue" in out
    assert "removed 1" in out
    assert get_store(listed_store).get(ghost) is None
    assert lock((5,)).owner == queued.id
    assert get_store(listed_store).get(young) is not None


def test_older_than_keeps_a_message_a_worker_reserved(app: Any, listed_store: str) -> None:
    """A2: an old queued lock whose message a worker holds (reserved behind a running job)
    is kept: the worker reports it to inspect (or it sits in the broker's unacked set)."""
    with thread_worker(app, pool="threads", concurrency=1):
        busy = jobs.unique_sleep.delay(8, seconds=4)
        wait_for(lambda: lock((8, 4)) is not None and lock((8, 4)).state == "running")
        waiting = jobs.unique_sleep.delay(9)
        channel = app.connection_for_read().default_channel
        wait_for(lambda: not channel.client.llen(app.conf.task_default_queue))
        time.sleep(1.3)
        out = run("--older-than", "1")
        assert lock((9,)).owner == waiting.id, out
        assert "worker or queue 1" in out
        assert busy.get(timeout=20) == 8 and waiting.get(timeout=20) == 9


@pytest.mark.parametrize("database", [
    pytest.param("default", marks=pytest.mark.django_db(transaction=True), id="sqlite"),
    pytest.param("postgres", marks=pytest.mark.postgres, id="postgres"),
    pytest.param("mariadb", marks=pytest.mark.mariadb, id="mariadb"),
])
def test_expired_database_rows_are_removed(database: str, released: list[dict[str, Any]]) -> None:
    """A2 / S3: expired rows of the database store (by the database server's clock) are
    removed; held rows stay."""
    dedup = {**settings.DEDUP_JOBS, "STORE": "database", "DATABASE_ALIAS": database}
    with override_settings(DEDUP_JOBS=dedup):
        store = get_store("database")
        old = build_key("unique", "tests.unique_sleep", "item=10")
        assert store.acquire(old, "dead-owner", 0.2, now=clock.now()).acquired
        time.sleep(0.4)
        fill("database", 2)
        out = run("--store", "database")
        assert "expired row" in out and "removed 1" in out
        from dedup_jobs.models import JobLock

        assert JobLock.objects.using(database).count() == 2
        assert [r["owner"] for r in released] == ["dead-owner"]


@pytest.mark.django_db
def test_progress_is_printed_on_long_scans(monkeypatch: pytest.MonkeyPatch) -> None:
    """A2: long scans print progress as they go."""
    monkeypatch.setattr("dedup_jobs.management.commands.clear_stale_locks.PROGRESS_EVERY", 2)
    monkeypatch.setattr("dedup_jobs.management.commands.clear_stale_locks.BATCH", 2)
    fill("redis", 5)
    out = run("--store", "redis", "--dry-run")
    assert "… 2 locks scanned in store 'redis'" in out
    assert "… 4 locks scanned in store 'redis'" in out


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--older-than", "-5"], "must be a number of seconds above 0"),
        (["--older-than", "soon"], "is not a number of seconds"),
        (["--all"], "add --yes to confirm"),
        (["--yes"], "--yes only confirms --all"),
        (["--job", "tests.nope"], "'tests.nope' is not a registered dedup job"),
        (["--store", "nowhere"], "neither a CACHES alias"),
        (["--store", "locmem"], "cannot be cleared: this cache cannot list its keys"),
    ],
)
def test_bad_arguments_fail_with_a_clear_message(args: list[str], message: str) -> None:
    """A2: bad arguments exit non-zero (CommandError) with a message naming the problem."""
    with pytest.raises(CommandError, match=message):
        call_command("clear_stale_locks", *args, stdout=io.StringIO())


@pytest.mark.django_db
def test_unreachable_store_fails_with_a_clear_message() -> None:
    """A2: an unreachable store is a non-zero exit naming the store."""
    caches = unreachable_redis()
    with (
        override_settings(CACHES=caches),
        pytest.raises(CommandError, match="'redis' is unavailable"),
    ):
        call_command("clear_stale_locks", "--store", "redis", stdout=io.StringIO())


def test_dry_run_lists_every_lock_at_the_default_verbosity(app: Any, listed_store: str) -> None:
    """A2: --dry-run at the default verbosity lists every lock it would remove, one a line
    (job, id, owner, why; an id's control characters escaped so it stays on its line),
    then the summary; --all --dry-run lists each queued lock with its reason too."""
    store = get_store(listed_store)
    idents = ["item=1", "item=2", "two\nlines"]
    for n, ident in enumerate(idents):
        app.backend.store_result(f"done-{n}", n, states.SUCCESS)
        key = build_key("unique", "tests.unique_sleep", ident)
        assert store.acquire(key, f"done-{n}", 600, now=clock.now()).acquired
    pending = build_key("unique", "tests.unique_sleep", "item=9")
    assert store.acquire(pending, "pending-owner", 600, now=clock.now()).acquired
    out = io.StringIO()
    call_command("clear_stale_locks", "--dry-run", "--inspect-timeout", "0.3", stdout=out)
    lines = out.getvalue().splitlines()
    shown = ["item=1", "item=2", "two\\nlines"]
    expected = [
        f"would remove tests.unique_sleep[{ident}] in '{listed_store}', owner done-{n}: "
        f"owner task finished (SUCCESS)"
        for n, ident in enumerate(shown)
    ]
    assert sorted(line for line in lines if line.startswith("would remove ")) == expected
    assert lines[-1] == "4 held locks scanned: would remove 3; kept owner pending 1."
    assert all(store.get(build_key("unique", "tests.unique_sleep", i)) for i in idents)
    everything = io.StringIO()
    call_command("clear_stale_locks", "--all", "--dry-run", stdout=everything)
    listed = [line for line in everything.getvalue().splitlines() if "would remove" in line]
    assert len(listed) == 5  # the four locks, then the summary
    assert any(line.startswith("would remove tests.unique_sleep[item=9]") and
               "owner pending-owner: " in line for line in listed)


@pytest.mark.django_db
def test_a_store_failing_at_the_index_trim_fails_with_a_clear_message(redis_client: Any) -> None:
    """A2: a store error in the index trim that follows the scan (here the server refuses
    scripts to the cache's user by an ACL; the scan's reads are allowed) is a non-zero exit
    naming the store, not a traceback."""
    user = f"dedup-noscript-{time.monotonic_ns()}"
    redis_client.acl_setuser(user, enabled=True, passwords=["+pw"], keys=["*"],
                             channels=["*"], commands=["+@all", "-@scripting"])
    location = settings.REDIS_URL.replace("redis://", f"redis://{user}:pw@", 1) + "/9"
    caches = {**settings.CACHES,
              "noeval": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": location}}
    try:
        with (override_settings(CACHES=caches),
              pytest.raises(CommandError, match="'noeval': the index trim failed "
                                                  r"\(NoPermissionError: .*'evalsha'")):
            call_command("clear_stale_locks", "--store", "noeval", stdout=io.StringIO())
    finally:
        redis_client.acl_deluser(user)
