"""U3: N concurrent dispatchers of one key publish exactly one message."""

from __future__ import annotations

import multiprocessing
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.conf import settings
from django.db import connections

from tests import contention, jobs

pytestmark = pytest.mark.redis  # the broker


def queued(app: Any) -> int:
    with app.connection_for_read() as conn:
        return int(conn.default_channel.client.llen(app.conf.task_default_queue))


def test_threads_publish_exactly_one_message(app: Any, store_name: str) -> None:
    """U3: 8 threads x 50 same-key dispatches, 3 rounds: one message published per round."""
    for round_ in range(3):
        barrier = threading.Barrier(8)

        def burst(item: int = round_, barrier: threading.Barrier = barrier) -> int:
            barrier.wait(timeout=30)
            try:
                return sum(not jobs.unique_sleep.delay(item).deduplicated for _ in range(50))
            finally:
                connections.close_all()

        with ThreadPoolExecutor(8) as pool:
            published = sum(pool.map(lambda _: burst(), range(8)))
        assert published == 1, f"round {round_}: {published} dispatches published"
        assert queued(app) == round_ + 1


#: django-redis in `uv run pytest`; every other backend in the slow store matrix (`uv run
#: pytest -m matrix`, a CI step of its own)
MATRIX = pytest.mark.matrix
PROCESS_STORES = [
    pytest.param("redis", marks=pytest.mark.redis, id="django-redis"),
    pytest.param("djredis", marks=[pytest.mark.redis, MATRIX], id="django-cache-redis"),
    pytest.param("valkey", marks=[pytest.mark.redis, pytest.mark.valkey, MATRIX],
                 id="django-valkey"),
    pytest.param("postgres", marks=[pytest.mark.postgres, MATRIX], id="database-postgres"),
    pytest.param("mariadb", marks=[pytest.mark.mariadb, MATRIX], id="database-mariadb"),
    pytest.param("mariadb-as-mysql", marks=[pytest.mark.mariadb, MATRIX],
                 id="database-mariadb-as-mysql"),
    pytest.param("memcached", marks=MATRIX, id="memcached"),
]
PROCESSES, DISPATCHES, ROUNDS = 8, 200, 5


@pytest.mark.parametrize("store", PROCESS_STORES)
def test_processes_publish_exactly_one_message(
    app: Any, store: str, request: pytest.FixtureRequest
) -> None:
    """U3/S1/S2/S3: 8 processes x 200 same-key dispatches, 5 rounds, on the real Redis
    (django-redis and Django's own RedisCache), on a real Valkey (django-valkey), on
    PostgreSQL, on MariaDB (REPEATABLE READ; its one-statement upsert, and the upsert and
    read-back MySQL 8 takes) and on a real memcached (PyMemcacheCache): exactly one message
    published per round."""
    form = "duplicate_key_read" if store.endswith("-as-mysql") else ""
    caches: dict[str, Any] = {}
    database: tuple[str, str] | None = None
    if store in ("redis", "djredis", "valkey"):
        dedup: dict[str, Any] = {"STORE": store}
    elif store == "memcached":
        server = request.getfixturevalue("memcached_server")
        server.flush()
        dedup, caches = {"STORE": "memcached"}, {"memcached": server.cache()}
    else:
        alias = store.removesuffix("-as-mysql")
        dedup = {"STORE": "database", "DATABASE_ALIAS": alias}
        database = (alias, str(settings.DATABASES[alias]["NAME"]))
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Manager().Barrier(PROCESSES)
    figures = []
    started = time.monotonic()
    initargs = (barrier, dedup, database, form, caches)
    with ctx.Pool(PROCESSES, initializer=contention.init, initargs=initargs) as pool:
        for round_ in range(ROUNDS):
            results = pool.starmap(
                contention.burst, [(1000 + round_, DISPATCHES)] * PROCESSES, chunksize=1)
            published = sum(sum(r) for r in results)
            figures.append(published)
            assert sum(len(r) for r in results) == PROCESSES * DISPATCHES
            assert queued(app) == round_ + 1
    print(f"U3 {store}: messages published per round of {PROCESSES * DISPATCHES} dispatches: "
          f"{figures} ({time.monotonic() - started:.1f} s)")
    assert figures == [1] * ROUNDS
