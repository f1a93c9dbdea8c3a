"""A Celery app of its own for the fused dispatch's tests (issue 26): its broker is kombu's
Redis transport with dedup_jobs' channel (``broker_transport =
"dedup_jobs.transport:Transport"``) at a given URL, its queue its own; its jobs count their
runs in a Redis of the test's choosing (``runs``)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import redis
from celery import Celery
from django.conf import settings

from dedup_jobs.jobs.unique import UniqueJob

_numbers = itertools.count()
#: the broker's database on the test Redis (the store is in database 9 of the same server)
BROKER_DB = 12


@contextmanager
def keep_default_app() -> Iterator[None]:
    """Celery's test worker makes its app the process's default and current one
    (``setup_app_for_worker``): give both back to the suite's app afterwards, or every later
    test would publish to this app's broker (a private server that is gone by then)."""
    from tests.celery_app import app

    try:
        yield
    finally:
        app.set_default()
        app.set_current()


@dataclass
class FusedApp:
    app: Celery
    queue: str
    unique: Any  # UniqueJob(token, value) -> value, counts runs under runs:<token>
    quiet: Any  # the same, ignore_result (no result backend traffic)
    counter: redis.Redis

    def close(self) -> None:
        """The app's queues emptied, its connections closed."""
        self.counter.delete(self.queue, *[f"{self.queue}\x06\x16{p}" for p in (3, 6, 9)])
        self.app.close()

    def runs(self, token: str) -> int:
        return int(self.counter.get(f"runs:{token}") or 0)


def fused_app(broker: str, counter: redis.Redis, **conf: Any) -> FusedApp:
    n = next(_numbers)
    name = f"fused{n}"
    app = Celery(name, fixups=[], set_as_current=False)
    app.config_from_object("django.conf:settings", namespace="CELERY")
    queue = f"fused-{n}-{id(app)}"
    app.conf.update(broker_url=broker, broker_transport="dedup_jobs.transport:Transport",
                    task_default_queue=queue, result_expires=600,
                    broker_connection_retry_on_startup=True, **conf)

    def body(self: Any, token: str, value: int) -> int:
        counter.incr(f"runs:{token}")
        return value

    unique = app.task(base=UniqueJob, bind=True, name=f"{name}.unique", unique_for=60, shared=False,
                      unique_on=("token",))(body)
    quiet = app.task(base=UniqueJob, bind=True, name=f"{name}.quiet", unique_for=60, shared=False,
                     unique_on=("token",), ignore_result=True)(body)
    return FusedApp(app=app, queue=queue, unique=unique, quiet=quiet, counter=counter)



@contextmanager
def prefixed(fapp: FusedApp) -> Iterator[FusedApp]:
    """An app like ``fapp`` whose transport has kombu's ``global_keyprefix`` ("pfx:"): the
    queue's key is the transport's business, so none of its messages is fused."""
    other = fused_app(f"{settings.REDIS_URL}/{BROKER_DB}", fapp.counter,
                      broker_transport_options={"global_keyprefix": "pfx:"})
    try:
        yield other
    finally:
        fapp.counter.delete(f"pfx:{other.queue}")
        other.app.close()
