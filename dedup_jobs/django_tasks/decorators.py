"""``@unique(...)`` and ``@unique_until_processing(...)`` over a task made by ``@task`` (K1)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dedup_jobs.django_tasks import compat
from dedup_jobs.django_tasks.options import call_signature, checked
from dedup_jobs.django_tasks.tasks import wrap


def _decorator(release_on_start: bool, task: Any, options: dict[str, Any]) -> Any:
    def decorate(task: Any) -> Any:
        compat.package_of(task)  # a task made by @task, or a TypeError saying so
        label = task.module_path
        signature = call_signature(task.func, task.takes_context)
        return wrap(task, checked(label, signature, dict(options),
                                  release_on_start=release_on_start))

    return decorate(task) if task is not None else decorate


def unique(task: Any = None, /, **options: Any) -> Callable[[Any], Any] | Any:
    """At most one result of the task per unique id is enqueued or running (Laravel's
    ``ShouldBeUnique``): ``@unique(unique_for=3600)`` above ``@task()``."""
    return _decorator(False, task, options)


def unique_until_processing(task: Any = None, /, **options: Any) -> Callable[[Any], Any] | Any:
    """Unique until a worker starts the task: the lock is released at its start (Laravel's
    ``ShouldBeUniqueUntilProcessing``)."""
    return _decorator(True, task, options)
