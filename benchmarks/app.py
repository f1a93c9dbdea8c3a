"""The benchmark's Celery app and its jobs: the same job body under every contender.

Every job takes ``(item, seconds=0.0)``; the key is ``item`` alone for every contender that
has one. A run records itself in Redis (db ``RESULT_DB``) so executions can be counted across
worker processes, and every finished message (run or skipped) is counted by ``task_postrun``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")

import django

django.setup()

import redis  # noqa: E402
from celery import Celery  # noqa: E402
from celery.signals import task_postrun  # noqa: E402
from celery_once import QueueOnce  # noqa: E402
from celery_singleton import Singleton  # noqa: E402
from django.conf import settings  # noqa: E402

from dedup_jobs import UniqueJob, UniqueUntilProcessingJob  # noqa: E402

UNIQUE_FOR = 60  # seconds: the lock lifetime of every contender that has one

app = Celery("benchmarks", fixups=[])
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.update(
    task_default_queue=settings.QUEUE,
    broker_connection_retry_on_startup=True,
    task_ignore_result=True,
    worker_hijack_root_logger=False,
    # celery-once: Redis lock backend on the store database, lock as long as the others
    ONCE={
        "backend": "celery_once.backends.Redis",
        "settings": {
            "url": f"{settings.REDIS_URL}/{settings.STORE_DB}",
            "default_timeout": UNIQUE_FOR,
        },
    },
    # celery-singleton: same database, same lifetime
    singleton_backend_url=f"{settings.REDIS_URL}/{settings.STORE_DB}",
    singleton_lock_expiry=UNIQUE_FOR,
)

#: in-process hooks used while counting store commands (see benchmarks.commands)
RECORD = True
SNAPSHOT: Callable[[], None] | None = None


_records: dict[int, redis.Redis] = {}


def records() -> redis.Redis:
    """Where runs are recorded (one client per process; redis-py reconnects after a fork)."""
    if not _records:
        _records[0] = redis.Redis.from_url(f"{settings.REDIS_URL}/{settings.RESULT_DB}")
    return _records[0]


def _body(contender: str, item: int, seconds: float) -> int:
    if SNAPSHOT is not None:
        SNAPSHOT()
    if RECORD:
        records().rpush(f"runs:{contender}", item)
    if seconds:
        time.sleep(seconds)
    return item


@task_postrun.connect(weak=False)
def _finished(task_id: str | None = None, **kwargs: Any) -> None:
    if RECORD:
        records().rpush("finished", str(task_id))


@app.task(name="bench.plain")
def plain(item: int, seconds: float = 0.0) -> int:
    return _body("plain Celery", item, seconds)


@app.task(name="bench.once", base=QueueOnce, once={"graceful": True, "keys": ["item"]})
def once(item: int, seconds: float = 0.0) -> int:
    return _body("celery-once", item, seconds)


@app.task(name="bench.singleton", base=Singleton, unique_on=["item"])
def singleton(item: int, seconds: float = 0.0) -> int:
    return _body("celery-singleton", item, seconds)


@app.task(name="bench.unique", base=UniqueJob, unique_for=UNIQUE_FOR, unique_on=("item",))
def unique(item: int, seconds: float = 0.0) -> int:
    return _body("UniqueJob", item, seconds)


@app.task(
    name="bench.unique_django_cache",
    base=UniqueJob,
    unique_for=UNIQUE_FOR,
    unique_on=("item",),
    unique_via="django_redis_cache",
)
def unique_django_cache(item: int, seconds: float = 0.0) -> int:
    return _body("UniqueJob on Django's RedisCache", item, seconds)


@app.task(
    name="bench.until_processing",
    base=UniqueUntilProcessingJob,
    unique_for=UNIQUE_FOR,
    unique_on=("item",),
)
def until_processing(item: int, seconds: float = 0.0) -> int:
    return _body("UniqueUntilProcessingJob", item, seconds)


@app.task(name="bench.noop")
def noop(*args: Any) -> None:
    return None


def _debounced() -> tuple[Any, str]:
    """The DebouncedJob contender, or None and the reason it cannot be measured yet."""
    try:
        from dedup_jobs import DebouncedJob

        # Built now (not lazily, not shared) so a refused class leaves nothing registered.
        @app.task(
            name="bench.debounced",
            base=DebouncedJob,
            debounce_for=2.0,
            max_wait=10.0,
            debounce_on=("item",),
            lazy=False,
            shared=False,
        )
        def debounced(item: int, seconds: float = 0.0) -> int:
            return _body("DebouncedJob", item, seconds)

    except Exception as exc:  # the placeholder refuses to build a class
        return None, f"{type(exc).__name__}: {exc}"
    return debounced, ""


debounced, DEBOUNCED_MISSING = _debounced()
