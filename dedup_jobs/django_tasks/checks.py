"""The system check of unique Django tasks (K3), registered by ``dedup_jobs.checks``."""

from __future__ import annotations

from typing import Any

from django.core import checks

from dedup_jobs.django_tasks.backends import checked_at_start, class_path, debounce_problem
from dedup_jobs.django_tasks.tasks import made


def check_backends(_error: Any, _warning: Any) -> list[checks.CheckMessage]:
    """E016: a debounced or throttled task on a backend that cannot defer (or, debounced,
    take back) a task; W010: a task on a backend whose worker bypasses ``Task.call``."""
    found: list[checks.CheckMessage] = []
    seen: set[tuple[str, str]] = set()
    for task in made:
        try:
            backend = task.get_backend()
        except Exception:
            continue  # the framework's own check reports a backend that is not configured
        if (task.dedup.label, task.backend) in seen:
            continue
        seen.add((task.dedup.label, task.backend))
        problem = debounce_problem(backend) if hasattr(task.dedup, "debounce_for") else ""
        if hasattr(task.dedup, "throttle_on") and not getattr(backend, "supports_defer", False):
            problem = "cannot defer a task (supports_defer is False)"
        if problem:
            found.append(_error(
                16,
                f"The {task.dedup.kind_label.split(' (')[0]} Django task {task.dedup.label} "
                f"runs on the task backend "
                f"{task.backend!r} ({class_path(backend)}), which {problem}: its enqueue "
                f"raises InvalidJobConfiguration.",
                "Run it on django-tasks-db's DatabaseBackend or django-tasks-rq's RQBackend "
                "(@task(backend=...) or .using(backend=...))."))
        if checked_at_start(backend):
            continue
        found.append(_warning(
            10,
            f"The Django task {task.dedup.label} runs on the task backend "
            f"{task.backend!r} ({class_path(backend)}), whose worker does not run tasks "
            f"through Task.call: no worker-side check runs (a task enqueued around the "
            f"decorator is not refused), no lease is renewed, and the lock is released only "
            f"when unique_for expires.",
            "Run the task on a backend that calls Task.call from its worker (ImmediateBackend, "
            "django-tasks-db's DatabaseBackend, django-tasks-rq's RQBackend), or make your "
            "backend's worker call task.call(...) after sending task_started."))
    return found
