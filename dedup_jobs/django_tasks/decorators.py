"""``@unique(...)`` and ``@unique_until_processing(...)`` over a task made by ``@task`` (K1)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dedup_jobs.django_tasks import compat
from dedup_jobs.django_tasks.debounce import DebouncedTaskMixin
from dedup_jobs.django_tasks.options import (
    call_signature,
    checked,
    checked_debounce,
    checked_throttle,
)
from dedup_jobs.django_tasks.tasks import wrap
from dedup_jobs.django_tasks.throttle import ThrottledTaskMixin


def _decorator(kind: str, task: Any, options: dict[str, Any]) -> Any:
    def decorate(task: Any) -> Any:
        compat.package_of(task)  # a task made by @task, or a TypeError saying so
        label = task.module_path
        signature = call_signature(task.func, task.takes_context)
        if kind == "debounced":
            return wrap(task, checked_debounce(label, signature, dict(options)),
                        DebouncedTaskMixin)
        if kind == "throttled":
            return wrap(task, checked_throttle(label, signature, dict(options)),
                        ThrottledTaskMixin)
        return wrap(task, checked(label, signature, dict(options),
                                  release_on_start=kind == "until_processing"))

    return decorate(task) if task is not None else decorate


def unique(task: Any = None, /, **options: Any) -> Callable[[Any], Any] | Any:
    """At most one result of the task per unique id is enqueued or running (Laravel's
    ``ShouldBeUnique``): ``@unique(unique_for=3600)`` above ``@task()``."""
    return _decorator("unique", task, options)


def unique_until_processing(task: Any = None, /, **options: Any) -> Callable[[Any], Any] | Any:
    """Unique until a worker starts the task: the lock is released at its start (Laravel's
    ``ShouldBeUniqueUntilProcessing``)."""
    return _decorator("until_processing", task, options)


def debounced(task: Any = None, /, **options: Any) -> Callable[[Any], Any] | Any:
    """Only the last enqueue of a burst runs, ``debounce_for`` seconds after it, with its
    arguments; never later than ``max_wait`` after the burst's first (Laravel's
    ``DebounceFor``): ``@debounced(debounce_for=30, max_wait=120)`` above ``@task()``."""
    return _decorator("debounced", task, options)


def throttled(task: Any = None, /, **options: Any) -> Callable[[Any], Any] | Any:
    """At most ``concurrency`` runs of one throttle key at once, at most ``throttle`` ("K/s",
    "K/m", "K/h") starts of it: ``@throttled(concurrency=2, throttle="10/m",
    throttle_on=("account",))`` above ``@task()``. A call over the limit is enqueued again
    for when it may start."""
    return _decorator("throttled", task, options)
