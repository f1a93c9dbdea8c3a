"""Jobs of the fault-injection tests. Each records its body's start and end (wall clock, task
id, pid, the broker's ``redelivered`` flag) in the run-record Redis db of ``tests.jobs``
(db 12 of the healthy test Redis, flushed before every test), so a test can tell across
threads and processes which copies ran and whether two ran at once.

Found by the test process (imported by the tests), by in-process workers (same registry) and
by subprocess workers (``tests/celery_app.py`` autodiscovers ``tests.faults.jobs``)."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from celery import shared_task
from celery.signals import task_prerun

from dedup_jobs import DebouncedJob, ThrottledJob, UniqueJob, UniqueUntilProcessingJob
from tests.jobs import runs_client
from tests.jobs_guard import wait_gate

DEBOUNCE_FOR = 0.3


def mark(token: str, event: str, **fields: Any) -> None:
    runs_client().rpush(
        f"faults:{token}", json.dumps({"event": event, "at": time.time(), **fields})
    )


def marks(token: str, event: str | None = None) -> list[dict[str, Any]]:
    rows = [json.loads(v) for v in runs_client().lrange(f"faults:{token}", 0, -1)]
    return [row for row in rows if event is None or row["event"] == event]


def bodies(token: str) -> list[dict[str, Any]]:
    """One row per body that started: task id, pid, redelivered, start and end (None while
    it runs, or if it was killed)."""
    rows: list[dict[str, Any]] = []
    for row in marks(token):
        if row["event"] == "start":
            rows.append({**row, "start": row["at"], "end": None})
        elif row["event"] == "end":
            for body in rows:
                if body["run"] == row["run"]:
                    body["end"] = row["at"]
    return rows


def overlaps(token: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Pairs of bodies of ``token`` that ran at the same time (a running one has no end)."""
    found = []
    rows = bodies(token)
    for i, first in enumerate(rows):
        for second in rows[i + 1 :]:
            first_end = first["end"] if first["end"] is not None else float("inf")
            second_end = second["end"] if second["end"] is not None else float("inf")
            if first["start"] < second_end and second["start"] < first_end:
                found.append((first, second))
    return found


def _body(task: Any, token: str, seconds: float, gate: str, value: Any) -> None:
    info = task.request.delivery_info or {}
    run = f"{os.getpid()}-{time.monotonic_ns()}"
    mark(
        token,
        "start",
        run=run,
        task_id=task.request.id,
        pid=os.getpid(),
        value=value,
        redelivered=bool(info.get("redelivered")),
    )
    time.sleep(seconds)
    wait_gate(gate)
    mark(token, "end", run=run, task_id=task.request.id)


@shared_task(
    bind=True, base=UniqueJob, unique_for=60, unique_on=("token",), name="tests.faults.unique"
)
def fault_unique(self: UniqueJob, token: str, value: int = 0, seconds: float = 0.0) -> int:
    """A UniqueJob whose body takes ``seconds``."""
    _body(self, token, seconds, "", value)
    return value


@shared_task(
    bind=True, base=UniqueUntilProcessingJob, unique_for=60, unique_on=("token",),
    name="tests.faults.until",
)
def fault_until(self: UniqueJob, token: str, value: int = 0, seconds: float = 0.0) -> int:
    """A UniqueUntilProcessingJob whose body takes ``seconds``."""
    _body(self, token, seconds, "", value)
    return value


@shared_task(
    bind=True, base=UniqueUntilProcessingJob, unique_for=60, unique_on=("token",),
    without_overlapping=True, name="tests.faults.exclusive",
)
def fault_exclusive(self: UniqueJob, token: str, value: int = 0, seconds: float = 0.0) -> int:
    """A UniqueUntilProcessingJob without_overlapping (R2) whose body takes ``seconds``."""
    _body(self, token, seconds, "", value)
    return value


@shared_task(
    bind=True, base=UniqueJob, unique_for=60, unique_on=("token",), on_duplicate="replace",
    name="tests.faults.replace",
)
def fault_replace(self: UniqueJob, token: str, value: int = 0, seconds: float = 0.0) -> int:
    """A UniqueJob with on_duplicate = "replace" (R1) whose body takes ``seconds``."""
    _body(self, token, seconds, "", value)
    return value


def _throttled(name: str, **limits: Any) -> Any:
    """A ThrottledJob keyed by its ``token`` argument, whose body takes ``seconds``."""

    def body(self: ThrottledJob, token: str, value: int = 0, seconds: float = 0.0) -> int:
        _body(self, token, seconds, "", value)
        return value

    return shared_task(bind=True, base=ThrottledJob, throttle_on=("token",),
                       name=f"tests.faults.{name}", **limits)(body)


fault_one_at_once = _throttled("one_at_once", concurrency=1)
fault_two_at_once = _throttled("two_at_once", concurrency=2)
fault_five_per_second = _throttled("five_per_second", throttle="5/s")


@shared_task(
    bind=True,
    base=DebouncedJob,
    debounce_for=DEBOUNCE_FOR,
    debounce_on=("token",),
    name="tests.faults.debounced",
)
def fault_debounced(self: DebouncedJob, token: str, value: int = 0) -> int:
    """A DebouncedJob (debounce_for 0.3 s) that records the value it ran with."""
    _body(self, token, 0.0, "", value)
    return value


@shared_task(
    bind=True,
    base=UniqueJob,
    unique_for=60,
    unique_on=("token",),
    acks_late=True,
    name="tests.faults.acks_late",
)
def fault_acks_late(self: UniqueJob, token: str, gate: str = "") -> str:
    """An acks_late UniqueJob that runs until the test opens ``gate``."""
    _body(self, token, 0.0, gate, None)
    return token


@shared_task(
    bind=True,
    base=UniqueJob,
    unique_for=60,
    unique_on=("token", "value"),
    throttle_on=("token",),
    concurrency=1,
    acks_late=True,
    name="tests.faults.acks_late_one_at_once",
)
def fault_acks_late_one_at_once(self: UniqueJob, token: str, value: int = 0,
                                gate: str = "") -> int:
    """fault_acks_late with one run at once per ``token`` (T2; its lock per token and value)."""
    _body(self, token, 0.0, gate, value)
    return value


#: the jobs whose every delivery is recorded (event "delivery")
DELIVERIES_OF = {fault_acks_late.name, fault_acks_late_one_at_once.name,
                 fault_two_at_once.name, fault_five_per_second.name, fault_replace.name}


@task_prerun.connect(weak=False, dispatch_uid="tests.faults.jobs.deliveries")
def _delivered(
    sender: Any = None, task_id: Any = None, args: Any = None, kwargs: Any = None, **extra: Any
) -> None:
    """Every delivery of fault_acks_late (and of the throttled jobs) reaching a worker, before
    any dedup check: so a test sees a redelivered copy arrive even when the guard keeps its
    body from running, or a message reach the worker while its store is down."""
    if getattr(sender, "name", None) not in DELIVERIES_OF:
        return
    token = (kwargs or {}).get("token") or (args[0] if args else "")
    info = sender.request.delivery_info or {}
    mark(
        str(token),
        "delivery",
        task_id=task_id,
        pid=os.getpid(),
        redelivered=bool(info.get("redelivered")),
    )
