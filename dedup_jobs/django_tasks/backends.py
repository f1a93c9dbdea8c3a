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


def _of(backend: Any, package: str) -> bool:
    return any(base.__module__.startswith(package) for base in type(backend).__mro__)


def debounce_problem(backend: Any) -> str:
    """Why ``backend`` cannot run a debounced task ("" when it can): the burst's task waits
    with ``run_after`` (``supports_defer``), and an absorbed enqueue's own task is taken back
    (:func:`discard`), which django-tasks-db and django-tasks-rq allow."""
    if not getattr(backend, "supports_defer", False):
        return "cannot defer a task (supports_defer is False)"
    if not (_of(backend, "django_tasks_db") or _of(backend, "django_tasks_rq")):
        return "dedup_jobs cannot take back a task it queued"
    return ""


def discard(backend: Any, result_id: str, *, atomic: bool = False) -> None:
    """Take back a task the backend queued for an enqueue that turned out a duplicate or was
    absorbed into a burst: django-tasks-rq's job (queued before ``task_enqueued``) is
    deleted; django-tasks-db's row is deleted when ``atomic`` (inside the enqueue's own
    transaction; a duplicate's row is rolled back instead). Best effort for rq: a job left
    behind is refused by the worker-side check (W3)."""
    if atomic and _of(backend, "django_tasks_db"):
        from django_tasks_db.models import DBTaskResult

        DBTaskResult.objects.filter(id=result_id).delete()
        return
    if not _of(backend, "django_tasks_rq"):
        return
    try:
        job = backend._get_job(result_id)
        if job is not None:
            job.delete()
    except Exception:
        logger.warning("Could not take back the rq job %s; the worker-side check refuses "
                       "it when it starts.", result_id, exc_info=True)
