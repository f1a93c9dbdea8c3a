"""The unique Django tasks this process knows, for the admin and ``clear_stale_locks`` (K4):
the ones made here (:data:`dedup_jobs.django_tasks.tasks.made`), and one a lock names by its
module path, imported when that path is in an installed app."""

from __future__ import annotations

import logging
from typing import Any

from django.apps import apps
from django.utils.module_loading import import_string

from dedup_jobs.django_tasks import compat
from dedup_jobs.django_tasks.tasks import made

logger = logging.getLogger("dedup_jobs")

#: the statuses of a finished result
FINISHED = frozenset({"SUCCESSFUL", "FAILED"})

def unique_tasks() -> list[Any]:
    """Every unique Django task made in this process, one per module path, by path."""
    by_label = {task.dedup.label: task for task in made}
    return [by_label[label] for label in sorted(by_label)]


def find(name: str) -> Any | None:
    """The unique Django task whose module path is ``name``, or None (a Celery job's name,
    or a path outside the installed apps, which is never imported)."""
    for task in made:
        if task.dedup.label == name:
            return task
    module = name.rpartition(".")[0]
    if not module or not any(module == app.name or module.startswith(f"{app.name}.")
                             for app in apps.get_app_configs()):
        return None
    try:
        found = import_string(name)
    except ImportError:
        return None
    return found if any(found is task for task in made) else None


def kind_label(task: Any) -> str:
    return str(task.dedup.kind_label)


def status_of(task: Any, owner: str) -> tuple[bool, str | None]:
    """``(asked, status)``: whether a backend that keeps results was asked, and the status
    of ``owner``'s result (None: no such backend has it). The task's own backend is asked
    first, then every other one configured (``using(backend=...)`` may have enqueued it
    elsewhere; result ids are unique)."""
    missing = compat.result_missing(task)
    handler = compat.package_of(task).task_backends
    asked = False
    for alias in [task.backend, *(a for a in handler.settings if a != task.backend)]:
        backend = handler[alias]
        if not getattr(backend, "supports_get_result", False):
            continue
        asked = True
        try:
            return True, str(backend.get_result(owner).status)
        except missing:
            continue
    return asked, None


def finished(task: Any, owner: str, *, not_found_after: float, acquired_at: float,
             now: float) -> str | None:
    """The status that makes ``owner``'s result finished (``SUCCESSFUL``, ``FAILED``), "not
    found" for a result that no backend keeping results has once the lock is older than
    ``not_found_after`` seconds (an enqueue that died before its commit), else None (pending,
    or no backend that keeps results)."""
    asked, status = status_of(task, owner)
    if status is None:
        return "not found" if asked and now - acquired_at > not_found_after else None
    return status if status in FINISHED else None
