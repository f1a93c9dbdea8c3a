"""U3: N concurrent dispatchers of one key publish exactly one message."""

from __future__ import annotations

import multiprocessing
import threading
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


PROCESS_STORES = [
    pytest.param("redis", marks=pytest.mark.redis, id="django-redis"),
    pytest.param("djredis", marks=pytest.mark.redis, id="django-cache-redis"),
    pytest.param("valkey", marks=[pytest.mark.redis, pytest.mark.valkey], id="django-valkey"),
    pytest.param("database-postgres", marks=pytest.mark.postgres, id="database-postgres"),
    pytest.param("memcached", id="memcached"),
]
DISPATCHES = 200  # per process and round


@pytest.mark.parametrize("store", PROCESS_STORES)
def test_processes_publish_exactly_one_message(
    app: Any, store: str, request: pytest.FixtureRequest
) -> None:
    """U3/S1/S2/S3: 8 processes x 200 same-key dispatches, 5 rounds, on the real Redis
    (django-redis and Django's own RedisCache), on a real Valkey (django-valkey), on
    PostgreSQL and on a real memcached (PyMemcacheCache): exactly one message published
    per round."""
    caches: dict[str, Any] = {}
    pg_name = None
    if store in ("redis", "djredis", "valkey"):
        dedup: dict[str, Any] = {"STORE": store}
    elif store == "memcached":
        server = request.getfixturevalue("memcached_server")
        server.flush()
        dedup, caches = {"STORE": "memcached"}, {"memcached": server.cache()}
    else:
        dedup = {"STORE": "database", "DATABASE_ALIAS": "postgres"}
        pg_name = settings.DATABASES["postgres"]["NAME"]
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Manager().Barrier(8)
    figures = []
    with ctx.Pool(8, initializer=contention.init,
                  initargs=(barrier, dedup, pg_name, caches)) as pool:
        for round_ in range(5):
            results = pool.starmap(contention.burst, [(1000 + round_, DISPATCHES)] * 8,
                                   chunksize=1)
            published = sum(sum(r) for r in results)
            figures.append(published)
            assert sum(len(r) for r in results) == 8 * DISPATCHES
            assert queued(app) == round_ + 1
    print(f"U3 {store}: messages published per round of {8 * DISPATCHES} dispatches: "
          f"{figures}")
    assert figures == [1] * 5
