"""DebouncedJob on RabbitMQ, where ETA messages are held by the worker (prefetch raised per
ETA message) rather than by a broker-side delay: a prefork worker in a subprocess, the
django-redis store, results in Redis."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings

from tests import jobs_debounce as jobs
from tests.workers import process_worker

pytestmark = [pytest.mark.rabbitmq, pytest.mark.redis, pytest.mark.worker]


@pytest.fixture
def producer(app: Any) -> Iterator[Any]:
    """A producer on RabbitMQ, after purging what earlier runs left in our queue."""
    with app.connection_for_write(settings.RABBITMQ_URL) as conn:
        conn.ensure_connection(max_retries=2)
        app.control.purge(connection=conn)
        yield app.amqp.Producer(conn, auto_declare=True)


def test_burst_and_max_wait_on_rabbitmq(app: Any, producer: Any) -> None:
    """D1/D2/D4 on RabbitMQ: a burst of 20 runs once with the last arguments; a steady stream
    (every 0.25 s, debounce_for=1, max_wait=2.5) runs within max_wait (+ slack) of its first
    dispatch; every dispatch's result is the run that absorbed it."""
    with process_worker(
        broker=settings.RABBITMQ_URL, concurrency=2, extra=("-I", "tests.jobs_debounce")
    ):
        # The worker is up once a first debounced job has run through it.
        assert jobs.debounce_record.apply_async((99, 0), producer=producer).get(timeout=30) == 0
        burst = [jobs.debounce_record.apply_async((4, v), producer=producer) for v in range(20)]
        start = time.time()
        stream = []
        value = 0
        while time.time() - start < 3.5:
            last_sent = time.time()
            stream.append(jobs.debounce_capped.apply_async((2, value), producer=producer))
            value += 1
            time.sleep(0.25)
        assert [r.get(timeout=30) for r in burst] == [19] * 20
        outcomes = [r.get(timeout=30) for r in stream]
    assert jobs.values("record") == [[99, 0], [4, 19]]
    ran = jobs.runs("capped")
    # Capped: due at max_wait (2.5 s) after the first dispatch, so it runs while the stream
    # (3.5 s) still dispatches; uncapped, the stream would push it past its last dispatch plus
    # debounce_for (1 s). Not a bound on lateness, which CI's load stretches.
    assert ran[0][0] < last_sent + 1.0, (ran, start, last_sent)
    assert ran[0][1] < value - 1, (ran, value)  # the stream went on after the capped run
    assert sorted(set(outcomes)) == [v for _, v in ran]
    assert ran[-1][1] == value - 1
