"""Django tasks for the tests of dedup_jobs.django_tasks (SPEC §11): on the default backend
(ImmediateBackend) and on "db" (django-tasks-db's DatabaseBackend, run by real db_worker
processes in tests/test_django_tasks_workers.py). Runs are recorded in Redis (db 12, the
tests' runs database), so a test in another process can count them."""

from __future__ import annotations

import os
import time
from typing import Any

from dedup_jobs.django_tasks import debounced, throttled, unique, unique_until_processing
from tests import jobs

try:
    from django.tasks import task  # type: ignore[import-not-found,unused-ignore]
    from django.tasks.backends.base import (  # type: ignore[import-not-found,unused-ignore]
        BaseTaskBackend as _BaseBackend,
    )
    from django.tasks.signals import task_enqueued  # type: ignore[import-not-found,unused-ignore]
except ImportError:
    from django_tasks import task  # type: ignore[no-redef,unused-ignore]
    from django_tasks.backends.base import (  # type: ignore[no-redef,unused-ignore]
        BaseTaskBackend as _BaseBackend,
    )
    from django_tasks.signals import task_enqueued  # type: ignore[no-redef,unused-ignore]

__all__ = ["task", "task_enqueued"]

BACKEND = os.environ.get("DEDUP_TASKS_BACKEND", "default")
#: the debounced and throttled tasks need a backend that defers: "db", or "rq" in
#: tests/test_django_tasks_rq.py
DEFER_BACKEND = os.environ.get("DEDUP_TASKS_DEFER_BACKEND", "db")


def _run(name: str, value: Any) -> Any:
    jobs.record(name, value)
    return value


def _hold(token: str) -> None:
    """Mark ``token`` running and wait until the test says go (at most 60 s)."""
    client = jobs.runs_client()
    client.set(f"running:{token}", "1")
    deadline = time.monotonic() + 60
    while not client.exists(f"go:{token}") and time.monotonic() < deadline:
        time.sleep(0.01)


@unique(unique_for=600)
@task(backend=BACKEND)
def indexed(product_id: int, note: str = "") -> int:
    _run(f"indexed:{product_id}", note or product_id)
    return product_id


@unique(unique_on=("product_id",), on_duplicate="raise")
@task(backend=BACKEND)
def raising(product_id: int, note: str = "") -> int:
    return int(_run(f"raising:{product_id}", product_id))


@unique(unique_id=lambda account, **_: f"account-{account}")
@task(backend=BACKEND, takes_context=True)
def with_context(context: Any, account: int, extra: int = 0) -> str:
    return str(_run(f"with_context:{account}", context.task_result.id))


@unique()
@task(backend=BACKEND)
def failing(token: str) -> None:
    _run(f"failing:{token}", token)
    raise RuntimeError(f"failing {token}")


@unique()
@task(backend=BACKEND)
def held(token: str) -> str:
    _hold(token)
    return str(_run(f"held:{token}", token))


@unique_until_processing(unique_on=("token",))
@task(backend=BACKEND)
def until_processing_held(token: str, note: str = "") -> str:
    _hold(f"{token}:{note}")
    return str(_run(f"until_processing_held:{token}", note))


@unique_until_processing()
@task(backend=BACKEND)
def until_processing(token: str) -> str:
    return str(_run(f"until_processing:{token}", token))


@debounced(debounce_for=2.0, max_wait=20.0, debounce_on=("key",))
@task(backend=DEFER_BACKEND)
def debounced_tail(key: str, n: int) -> int:
    _run(f"debounced_tail:{key}", n)
    return n


@throttled(concurrency=1, throttle_on=("key",))
@task(backend=DEFER_BACKEND)
def throttled_held(key: str, token: str) -> str:
    """Records its start and its end, holding (until go) in between."""
    _run(f"throttled_held:{key}", f"{token}:start")
    _hold(f"{key}:{token}")
    return str(_run(f"throttled_held:{key}", f"{token}:end"))


def _unique_for_plan(plan: str, n: int = 0) -> float | None:
    return {"free": 120.0, "vip": None}.get(plan, "soon")  # type: ignore[return-value]


@unique(unique_for=_unique_for_plan)
@task(backend="db")
def per_plan_unique(plan: str, n: int = 0) -> int:
    """L1: a "free" call's lock lives 120 s, "vip" the default; "bad" answers no seconds."""
    return int(_run(f"per_plan_unique:{plan}", n))


@debounced(debounce_for=lambda plan, n=0: None if plan == "vip" else 1.0,
           max_wait=lambda plan, n=0: 0.5 if plan == "short" else 30.0, debounce_on=("plan",))
@task(backend="db")
def per_plan_debounced(plan: str, n: int = 0) -> int:
    """L1: a "free" burst waits 1 s; "vip" is not debounced; "short" caps below it."""
    return int(_run(f"per_plan_debounced:{plan}", n))


@task(backend=BACKEND)
def plain(token: str) -> str:
    return str(_run(f"plain:{token}", token))




class UncheckedBackend(_BaseBackend):  # type: ignore[misc,valid-type]
    """A backend whose (imaginary) worker calls the function itself, not Task.call."""

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        raise NotImplementedError


@unique()
@task(backend="db")
def on_unchecked(token: str) -> str:
    return token
