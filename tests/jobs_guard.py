"""Jobs of the worker-guard tests. Every execution is recorded in Redis (``runs:<token>``), and a
job given a ``gate`` name blocks until the test opens that gate, so a test decides exactly when a
copy is running and when it finishes. ``gate`` is never part of a key."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from celery import shared_task

from dedup_jobs import UniqueJob, UniqueUntilProcessingJob
from tests.jobs import record, runs, runs_client

GATE_TIMEOUT = 30.0

__all__ = ["open_gate", "record", "runs", "started"]


def open_gate(gate: str) -> None:
    runs_client().set(f"gate:{gate}", 1, ex=300)


def wait_gate(gate: str) -> None:
    """Block until the test opens ``gate``; never forever."""
    if not gate:
        return
    client = runs_client()
    deadline = time.monotonic() + GATE_TIMEOUT
    while not client.exists(f"gate:{gate}"):
        if time.monotonic() > deadline:
            raise TimeoutError(f"gate {gate!r} was not opened within {GATE_TIMEOUT}s")
        time.sleep(0.02)


def started(token: str) -> int:
    return len(runs(token))


@shared_task(base=UniqueJob, unique_for=60, unique_on=("token", "item"), name="tests.guard_gated")
def guard_gated(token: str, item: int, gate: str = "") -> int:
    record(token, item)
    wait_gate(gate)
    return item


@shared_task(base=UniqueJob, unique_for=60, unique_on=("token",), name="tests.guard_collect")
def guard_collect(results: list[Any], token: str, gate: str = "") -> list[Any]:
    """A chord body (the header's results come first)."""
    record(f"{token}:body", results)
    wait_gate(gate)
    return results


@shared_task(
    bind=True,
    base=UniqueJob,
    unique_for=60,
    unique_on=("token",),
    max_retries=2,
    name="tests.guard_retry",
)
def guard_retry(self: UniqueJob, token: str, gate: str = "") -> int:
    """Attempt 0 asks for a retry; attempt 1 waits for the gate and succeeds."""
    record(token, self.request.retries)
    if self.request.retries == 0:
        raise self.retry(countdown=0.3)
    wait_gate(gate)
    return int(self.request.retries)


@shared_task(
    base=UniqueJob,
    unique_for=60,
    unique_on=("token",),
    acks_late=True,
    name="tests.guard_acks_late",
)
def guard_acks_late(token: str, gate: str = "") -> str:
    record(token, "start")
    wait_gate(gate)
    record(token, "done")
    return token


@shared_task(base=UniqueJob, unique_for=1, unique_on=("token",), name="tests.guard_long")
def guard_long(token: str, gate: str = "") -> str:
    """Runs far longer than its unique_for (1 s) when gated (U5)."""
    record(token, "start")
    wait_gate(gate)
    return token


@shared_task(
    base=UniqueJob, unique_for=60, unique_on=("token",), time_limit=1, name="tests.guard_hard_limit"
)
def guard_hard_limit(token: str) -> None:
    """Ignores SIGTERM, as a job stuck in a C call would, so only the SIGKILL that follows
    stops it and nothing in its own process can release its lock."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    record(token, "start")
    time.sleep(10)


@shared_task(
    base=UniqueJob,
    unique_for=60,
    unique_on=("token",),
    soft_time_limit=0.5,
    name="tests.guard_soft_limit",
)
def guard_soft_limit(token: str) -> None:
    record(token, "start")
    time.sleep(10)


class GuardKeyless(UniqueJob):
    """Its unique_id() refuses negative items: a headerless message with one has no key (W4)."""

    name = "tests.guard_keyless"
    unique_for = 60

    def unique_id(self, token: str, item: int) -> str:
        if item < 0:
            raise ValueError(f"no key for item {item}")
        return f"{token}:{item}"

    def run(self, token: str, item: int) -> int:
        record(token, item)
        return item


@shared_task(
    base=UniqueUntilProcessingJob,
    unique_for=60,
    unique_on=("token",),
    name="tests.guard_until_processing",
)
def guard_until_processing(token: str, gate: str = "") -> str:
    record(token, "run")
    wait_gate(gate)
    return token


@shared_task(name="tests.guard_ping")
def guard_ping() -> str:
    return "pong"


def _register_class_jobs() -> None:
    from tests.celery_app import app

    app.register_task(GuardKeyless())


_register_class_jobs()


@shared_task(base=UniqueJob, unique_for=60, unique_on=("token",), name="tests.guard_pid")
def guard_pid(token: str, gate: str = "") -> int:
    """Records the pid of the process running it (so a test can kill just that process)."""
    record(token, os.getpid())
    wait_gate(gate)
    return os.getpid()


@shared_task(
    bind=True,
    base=UniqueJob,
    unique_for=60,
    unique_on=("token",),
    retry_on_worker_lost=True,
    max_retries=1,
    default_retry_delay=0,
    name="tests.guard_pid_retry",
)
def guard_pid_retry(self: UniqueJob, token: str, gate: str = "") -> int:
    """As guard_pid; retried by Celery when its process is lost; the retry does not wait."""
    record(token, os.getpid())
    if self.request.retries == 0:
        wait_gate(gate)
    return int(self.request.retries)


@shared_task(base=UniqueJob, unique_for=1, unique_on=("token",), name="tests.guard_busy")
def guard_busy(token: str, seconds: float) -> str:
    """A body that never yields: a CPU loop of ``seconds`` (longer than a lease, W6), so a
    green thread of the gevent or eventlet pool never runs meanwhile."""
    record(token, "start")
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
    record(token, "done")
    return token


@shared_task(bind=True, base=UniqueJob, unique_for=60, unique_on=("token",),
             name="tests.guard_replace_page")
def guard_replace_page(self: UniqueJob, token: str, page: int = 0, gate: str = "") -> Any:
    """Page 0 replaces itself (Task.replace: the same id, the same key) by page 1, which
    starts 3 s later and waits for the gate."""
    record(token, page)
    if page == 0:
        return self.replace(guard_replace_page.si(token, 1, gate=gate).set(countdown=3))
    wait_gate(gate)
    return page
