"""What the task backends do that the decisions depend on: which backends' workers run a
task through ``Task.call`` (where the worker-side check lives, K2), and how to take back a
task that a backend had already queued when its enqueue turned out to be a duplicate."""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger("dedup_jobs")

#: backends (by class path) whose worker runs a task through ``Task.call``, after
#: ``task_started``: the worker-side check runs there
CHECKED_AT_START = frozenset({
    "django.tasks.backends.immediate.ImmediateBackend",
    "django_tasks.backends.immediate.ImmediateBackend",
    "django_tasks_db.backend.DatabaseBackend",
    "django_tasks_rq.backend.RQBackend",
})
#: backends that never run a task (nothing to check)
NEVER_RUN = frozenset({
    "django.tasks.backends.dummy.DummyBackend",
    "django_tasks.backends.dummy.DummyBackend",
})


def class_path(backend: Any) -> str:
    cls = type(backend)
    return f"{cls.__module__}.{cls.__qualname__}"


def checked_at_start(backend: Any) -> bool:
    """Does ``backend``'s worker call ``Task.call`` (also through a subclass)?"""
    return any(f"{base.__module__}.{base.__qualname__}" in CHECKED_AT_START | NEVER_RUN
               for base in type(backend).__mro__)


def discard(backend: Any, result_id: str) -> None:
    """Take back the task a duplicate enqueue queued before the lock said no (django-tasks-rq
    queues the job before it sends ``task_enqueued``). Best effort: a task left behind is
    refused by the worker-side check (it fails with DuplicateJob, W3)."""
    if not any(base.__module__.startswith("django_tasks_rq") for base in type(backend).__mro__):
        return
    try:
        job = backend._get_job(result_id)
        if job is not None:
            job.delete()
    except Exception:
        logger.warning("Could not take back the duplicate rq job %s; the worker-side check "
                       "refuses it when it starts.", result_id, exc_info=True)
