"""``manage.py clear_stale_locks`` on every Celery result backend a Django team runs (SPEC
A2): Redis, Celery's cache backend (in memory, as the example project has it, and on a real
memcached), django-celery-results (its database and its Django-cache backends) and none.
Finished owners are found by reading the backend in batches: one read per batch of locks,
never one per owner."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.core.management import call_command

from dedup_jobs import clock
from dedup_jobs.keys import build_key
from dedup_jobs.stores import get_store
from tests import jobs
from tests.memcached_server import MemcachedServer
from tests.workers import ROOT, thread_worker

pytestmark = [pytest.mark.redis, pytest.mark.django_db(transaction=True)]

#: locks whose owner finished, more than one batch of them (BATCH is set to 2 below)
FINISHED = 5


def reset_backend(app: Any) -> None:
    """Make ``app.backend`` build its backend again from ``app.conf`` (Celery caches it per
    app, or per thread for a backend that is not thread safe)."""
    app._backend_cache = None
    app._local.__dict__.pop("backend", None)


@contextmanager
def result_backend(app: Any, url: str | None) -> Iterator[Any]:
    """The test app with ``result_backend = url`` for the block: its backend."""
    before = app.conf.result_backend
    app.conf.result_backend = url
    reset_backend(app)
    try:
        yield app.backend
    finally:
        app.conf.result_backend = before
        reset_backend(app)


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("clear_stale_locks", "--store", "redis", "--inspect-timeout", "0.3", *args,
                 stdout=out)
    return out.getvalue()


def counted(monkeypatch: pytest.MonkeyPatch, backend: Any, name: str) -> list[int]:
    """The number of keys of each call of ``backend.<name>``, which still does its work."""
    calls: list[int] = []
    real = getattr(backend, name)

    def spy(keys: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(len(keys))
        return real(keys, *args, **kwargs)

    monkeypatch.setattr(backend, name, spy)
    return calls


@pytest.fixture
def memcached(memcached_server: MemcachedServer) -> str:
    memcached_server.flush()
    return memcached_server.location


@pytest.mark.parametrize("kind", ["redis", "cache-memory", "cache-memcached"])
def test_finished_owners_are_read_in_batches_on_every_key_value_backend(
    app: Any, kind: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A2: on the Redis result backend and on Celery's cache backend (``cache+memory://``,
    the example project's default, and memcached), locks whose owner task finished are
    removed, a lock whose owner has no result yet is kept, and the results are read with one
    multi-key read per batch of locks (five finished owners, batches of two: three reads),
    never one read per owner."""
    from django.conf import settings

    url = {
        "redis": settings.CELERY_RESULT_BACKEND,
        "cache-memory": "cache+memory://",
        "cache-memcached": "",
    }[kind]
    if kind == "cache-memcached":
        url = f"cache+memcached://{request.getfixturevalue('memcached')}/"
    monkeypatch.setattr("dedup_jobs.management.commands.clear_stale_locks.BATCH", 2)
    store = get_store("redis")
    with result_backend(app, url) as backend:
        with thread_worker(app):  # a real worker stores the results through the backend
            done = [jobs.unique_sleep.delay(100 + n) for n in range(FINISHED)]
            assert [r.get(timeout=20) for r in done] == [100 + n for n in range(FINISHED)]
        for n, result in enumerate(done):  # each finished task's lock left behind
            key = build_key("unique", "tests.unique_sleep", f"left={n}")
            assert store.acquire(key, result.id, 600, now=clock.now()).acquired
        pending = build_key("unique", "tests.unique_sleep", "left=pending")
        assert store.acquire(pending, "no-result-yet", 600, now=clock.now()).acquired
        reads = counted(monkeypatch, backend, "mget")
        dry = run("--dry-run")
        assert reads == [2, 2, 2], reads  # 6 locks in batches of 2, one read each
        assert dry.count("owner task finished (SUCCESS)") == FINISHED, dry
        assert f"{FINISHED + 1} held locks scanned: would remove {FINISHED}; kept owner " \
               f"pending 1." in dry
        out = run()
    assert f"removed {FINISHED}; kept owner pending 1." in out, out
    assert store.get(pending) is not None
    assert all(store.get(build_key("unique", "tests.unique_sleep", f"left={n}")) is None
               for n in range(FINISHED))


def test_no_result_backend_keeps_locks_and_says_why(
    app: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A2: with no result backend (``result_backend = None``: Celery's DisabledBackend) no
    owner can be known finished: every lock is kept, the summary says to use --older-than,
    and --older-than still removes an old lock whose owner no worker or queue holds."""
    store = get_store("redis")
    with result_backend(app, None):
        key = build_key("unique", "tests.unique_sleep", "left=ghost")
        assert store.acquire(key, "ghost-owner", 600, now=clock.now()).acquired
        out = run()
        assert "1 held locks scanned: removed 0; kept owner pending 1." in out
        assert "result backend is disabled" in out and "--older-than" in out
        later = clock.now() + 60
        monkeypatch.setattr("dedup_jobs.clock.now", lambda: later)
        old = run("--older-than", "30")
    assert "removed 1" in old, old
    assert store.get(key) is None


RESULTS_SCRIPT = """
import io, os, sys
import django
django.setup()
from celery import states
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from dedup_jobs import clock
from dedup_jobs.keys import build_key
from dedup_jobs.stores import get_store
from tests.celery_app import app

call_command("migrate", verbosity=0)
app.conf.result_backend = sys.argv[1]
app.conf.cache_backend = "redis"  # django-cache on a django-redis cache
backend = app.backend
print(type(backend).__module__ + "." + type(backend).__name__)
store = get_store("redis")
for n in range(5):
    backend.store_result(f"done-{n}", n, states.SUCCESS)  # as a worker stores it
    key = build_key("unique", "tests.unique_sleep", f"left={n}")
    assert store.acquire(key, f"done-{n}", 600, now=clock.now()).acquired
backend.store_result("failed-0", ValueError("x"), states.FAILURE)
assert store.acquire(build_key("unique", "tests.unique_sleep", "left=f"), "failed-0", 600,
                     now=clock.now()).acquired
backend.store_result("started-0", None, states.STARTED)
assert store.acquire(build_key("unique", "tests.unique_sleep", "left=s"), "started-0", 600,
                     now=clock.now()).acquired
assert store.acquire(build_key("unique", "tests.unique_sleep", "left=p"), "pending-0", 600,
                     now=clock.now()).acquired
import dedup_jobs.management.commands.clear_stale_locks as command
command.BATCH = 3
reads = []  # django-cache: each multi-key read of the cache, and each one-owner read
if hasattr(backend, "cache_backend"):
    cache, real_get = backend.cache_backend, backend.get
    real_get_many = cache.get_many
    cache.get_many = lambda keys, *a, **k: reads.append(len(keys)) or real_get_many(keys, *a, **k)
    backend.get = lambda key: reads.append(1) or real_get(key)
out = io.StringIO()
with CaptureQueriesContext(connection) as queries:
    call_command("clear_stale_locks", "--store", "redis", "--inspect-timeout", "0.3",
                 stdout=out)
result_reads = [q["sql"] for q in queries.captured_queries
                if "django_celery_results_taskresult" in q["sql"]]
print("reads", len(result_reads) if result_reads else len(reads))
print(out.getvalue().strip().splitlines()[-1])
print("left", sorted(lock.ident for lock in store.iter_locks()))
"""


@pytest.mark.parametrize("backend", ["django-db", "django-cache"])
def test_django_celery_results_backends(backend: str) -> None:
    """A2: with django-celery-results (its ``django-db`` and ``django-cache`` backends, in a
    project that installs the app) finished owners (SUCCESS, FAILURE) are removed, a started
    and a pending one kept, with one read of the results per batch of locks (eight locks,
    batches of three: three reads), never one per owner."""
    out = subprocess.run(
        [sys.executable, "-c", RESULTS_SCRIPT, backend], cwd=ROOT, capture_output=True,
        text=True, timeout=120,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings_results"})
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert lines[0].startswith("django_celery_results.backends."), lines
    assert lines[1] == "reads 3", lines
    assert lines[2] == "8 held locks scanned: removed 6; kept owner pending 2.", lines
    assert lines[3] == "left ['left=p', 'left=s']", lines
