"""Debounced jobs used by the tests and the benchmark. Every run is recorded in Redis (as in
tests.jobs) with the time it started, so a test can check which arguments ran and when."""

from __future__ import annotations

import json
import time
from typing import Any

from celery import shared_task

from dedup_jobs import DebouncedJob
from tests.jobs import runs_client


def record(name: str, value: Any) -> None:
    runs_client().rpush(f"debounce:{name}", json.dumps([time.time(), value]))


def runs(name: str) -> list[tuple[float, Any]]:
    return [tuple(json.loads(v)) for v in runs_client().lrange(f"debounce:{name}", 0, -1)]  # type: ignore[misc]


def values(name: str) -> list[Any]:
    return [value for _, value in runs(name)]


@shared_task(
    base=DebouncedJob,
    debounce_for=1.0,
    max_wait=3.0,
    debounce_on=("item",),
    name="tests.debounce_record",
)
def debounce_record(item: int, value: int) -> int:
    record("record", [item, value])
    return value


@shared_task(
    base=DebouncedJob,
    debounce_for=1.0,
    max_wait=2.5,
    debounce_on=("item",),
    name="tests.debounce_capped",
)
def debounce_capped(item: int, value: int) -> int:
    record("capped", value)
    return value


@shared_task(base=DebouncedJob, debounce_for=0.8, debounce_on=("item",), name="tests.debounce_fail")
def debounce_fail(item: int, value: int) -> None:
    record("fail", value)
    raise ValueError(f"boom {value}")


@shared_task(base=DebouncedJob, debounce_for=0.5, debounce_on=("item",), name="tests.debounce_slow")
def debounce_slow(item: int, value: int, seconds: float = 1.5) -> int:
    record("slow", value)
    time.sleep(seconds)
    return value


@shared_task(
    bind=True,
    base=DebouncedJob,
    debounce_for=0.8,
    debounce_on=("item",),
    max_retries=1,
    name="tests.debounce_retry",
)
def debounce_retry(self: DebouncedJob, item: int, value: int) -> int:
    record("retry", [value, self.request.retries])
    if self.request.retries == 0:
        raise self.retry(countdown=0.3)
    return value


@shared_task(
    base=DebouncedJob,
    debounce_for=0.8,
    debounce_on=("item",),
    ignore_result=True,
    name="tests.debounce_quiet",
)
def debounce_quiet(item: int, value: int) -> int:
    record("quiet", value)
    return value


@shared_task(
    base=DebouncedJob,
    debounce_for=1.5,
    max_wait=4.0,
    debounce_on=("item",),
    name="tests.debounce_stream",
)
def debounce_stream(item: int, value: int) -> int:
    record("stream", value)
    return value


class RebuildIndex(DebouncedJob):
    """Class style, with debounce_id()."""

    name = "tests.rebuild_index"
    debounce_for = 0.8
    max_wait = 5

    def debounce_id(self, product_id: int, **kwargs: Any) -> str:
        return f"product-{product_id}"

    def run(self, product_id: int, reason: str = "") -> str:
        record("rebuild_index", [product_id, reason])
        return reason


def _register_class_jobs() -> None:
    from tests.celery_app import app

    app.register_task(RebuildIndex())


_register_class_jobs()


# -- D8: chains -----------------------------------------------------------------------------


@shared_task(base=DebouncedJob, debounce_for=0.6, debounce_on=("item",), name="tests.debounce_link")
def debounce_link(item: int, value: int) -> int:
    """A DebouncedJob used as a link of a chain; a negative value fails the run."""
    record("link", [item, value])
    if value < 0:
        raise ValueError(f"boom {value}")
    return value


@shared_task(name="tests.chain_step")
def chain_step(previous: Any, tag: str) -> str:
    """A plain task for the other links of a chain: records what it received."""
    record("step", [tag, previous])
    return f"{tag}:{previous}"
