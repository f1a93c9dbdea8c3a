"""Helpers of the worker-guard tests: the two real brokers, a prefork subprocess worker per
broker, switching the test app's publisher to a broker, and small lock/result probes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from celery import Celery
from django.conf import settings
from kombu import pools

from dedup_jobs.keys import JobKey
from dedup_jobs.stores import get_store
from tests.workers import ROOT, process_worker, wait_for

QUEUE = os.environ.get("DEDUP_JOBS_TEST_QUEUE", "dedup_tests")
#: Redis db of the Redis broker of these tests: not one the per-test cleanup flushes, so one
#: worker can serve a whole module.
REDIS_BROKER_DB = 13
BROKERS = {
    "redis": f"{settings.REDIS_URL}/{REDIS_BROKER_DB}",
    "rabbitmq": settings.RABBITMQ_URL,
}
WORKER_SETTINGS = "tests.settings_guard"


def token() -> str:
    return uuid.uuid4().hex[:12]


def reset_queue(app: Any, url: str, queue: str = QUEUE) -> None:
    """Empty ``queue`` on this broker (and declare it, so nothing published before the worker
    is up is lost)."""
    with app.connection_for_write(url, connect_timeout=5) as conn:
        conn.ensure_connection(max_retries=3)
        bound = app.amqp.queues[queue](conn.default_channel)
        bound.declare()
        bound.purge()


@contextmanager
def publishing_to(app: Any, url: str) -> Iterator[None]:
    """Make ``app`` publish (delay, canvas, send_task) to the broker at ``url``."""
    saved = app._pool, app.amqp._producer_pool
    connection = app.connection_for_write(url)
    app._pool = pools.connections[connection]
    producers = pools.producers[app.connection_for_write(url)]
    producers.limit = app._pool.limit
    app.amqp._producer_pool = producers
    # Remote control (revoke, inspect) publishes through kombu's Mailbox, which caches the
    # producer pool it first saw (a cached_property): forget it on the way in and out, or a
    # revoke after an earlier inspect goes to the other broker.
    app.control.mailbox.__dict__.pop("producer_pool", None)
    try:
        yield
    finally:
        app._pool, app.amqp._producer_pool = saved
        app.control.mailbox.__dict__.pop("producer_pool", None)


@contextmanager
def guard_worker(
    app: Any,
    broker: str,
    *,
    pool: str = "prefork",
    concurrency: int = 4,
    queue: str = QUEUE,
    env: dict[str, str] | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """A ``celery worker`` subprocess consuming ``queue`` on ``broker`` with the guard
    settings, ready when yielded (it answered a ping task)."""
    url = BROKERS[broker]
    with process_worker(
        pool=pool, concurrency=concurrency, env=worker_env(queue, env), broker=url
    ) as proc:
        with publishing_to(app, url):
            from tests.jobs_guard import guard_ping

            assert guard_ping.apply_async(queue=queue).get(timeout=60) == "pong"
        yield proc


def worker_env(queue: str, env: dict[str, str] | None = None) -> dict[str, str]:
    """Environment of a guard worker consuming ``queue``."""
    return {
        "DJANGO_SETTINGS_MODULE": WORKER_SETTINGS,
        "DEDUP_JOBS_TEST_QUEUE": queue,
        **(env or {}),
    }


def kill_worker(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the worker and its pool children (a crash: nothing runs any cleanup)."""
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


def lock_key(task: Any, *args: Any, **kwargs: Any) -> JobKey:
    key: JobKey = task.job_key(args, kwargs)
    return key


def lock_of(task: Any, *args: Any, **kwargs: Any) -> Any:
    return get_store(task.store_alias()).get(lock_key(task, *args, **kwargs))


def wait_ready(result: Any, timeout: float = 20.0) -> Any:
    wait_for(result.ready, timeout=timeout)
    return result


def other_app(broker: str) -> Celery:
    """A second Celery app that has none of the project's task classes (as a client in
    another codebase: shared tasks would register in every app, so they are taken out)."""
    other = Celery(
        "guard_other",
        broker=BROKERS[broker],
        backend=settings.CELERY_RESULT_BACKEND,
        fixups=[],
        set_as_current=False,
    )
    other.conf.update(task_default_queue=QUEUE, broker_connection_retry_on_startup=True)
    other.finalize()
    for name in [name for name in other.tasks if name.startswith("tests.")]:
        other.tasks.unregister(name)
    return other


def report(path: str, broker: str, expected: Any, observed: Any) -> None:
    """Append one row of the entry path x broker table to $DEDUP_JOBS_GUARD_TABLE, if set."""
    target = os.environ.get("DEDUP_JOBS_GUARD_TABLE")
    if not target:
        return
    with open(target, "a", encoding="utf-8") as out:
        out.write(
            json.dumps(
                {
                    "path": path,
                    "broker": broker,
                    "expected": expected,
                    "observed": observed,
                    "at": time.time(),
                }
            )
            + "\n"
        )


def worker_logs() -> list[Any]:
    """The log files of this test process's subprocess workers (see tests.workers)."""
    return sorted(ROOT.glob(f".worker-{os.getpid()}.log"))
