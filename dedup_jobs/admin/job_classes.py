"""*Job classes*: every dedup job registered with the Celery app, with its settings, and every
unique Django task made in this process (K4)."""

from __future__ import annotations

import inspect
from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from dedup_jobs.admin import flow
from dedup_jobs.admin.common import PageAdmin, duration
from dedup_jobs.conf import app_settings
from dedup_jobs.django_tasks import registry as django_tasks
from dedup_jobs.jobs import registry
from dedup_jobs.jobs.base import DedupJob


def key_fields(job: DedupJob) -> str:
    """What forms the job's key: its id hook, its ``*_on`` names, or all of run's arguments."""
    if getattr(job, job._id_hook, None) is not None:
        return f"{job._id_hook}()"
    fields = getattr(job, job._key_fields_option, None)
    if fields:
        return ", ".join(fields)
    try:
        names = [p.name for p in inspect.signature(job.run).parameters.values()]
    except (TypeError, ValueError):
        return "all arguments"
    return f"all arguments ({', '.join(names)})" if names else "no arguments (one key)"


def _seconds(value: Any, default: float | None = None) -> str:
    """A job option in seconds as written ("0.5 s", "90 s"), whole minutes and hours
    shortened ("10 min", "1 h"); "per call" for a method (L1)."""
    if value is None:
        return "" if default is None else f"{_seconds(default)} (default)"
    if callable(value):
        return "per call"
    seconds = float(value)
    shown = duration(seconds) if seconds >= 60 and seconds % 60 == 0 else f"{seconds:g} s"
    return shown.replace(" ", "\u00a0")  # "10 min" never splits; " (default)" may wrap


def limit(value: Any) -> str:
    """A throttle option (T2, T3) as the page shows it: its value, "per call" for a method
    (L1: it takes the call's arguments), "" when unset."""
    if value is None:
        return ""
    return "per call" if callable(value) else str(value)


def throttle_key(job: DedupJob) -> str:
    """What the job's limits count by (T1), for the title of its limit cells."""
    if not job.throttled():
        return ""
    if getattr(job, "throttle_id", None) is not None:
        by = "throttle_id()"
    elif job.throttle_on:
        by = ", ".join(job.throttle_on)
    else:
        by = "the task name alone (one limit for the job)"
    return f"per throttle key: {by}"


def describe(job: DedupJob) -> dict[str, Any]:
    try:
        store = job.store_alias()
    except Exception as exc:  # a via() method that fails: show why instead of failing
        store = f"error: {exc}"
    unique = job.dedup_kind == "unique"
    return {
        "name": job.name,
        "kind": registry.kind_label(job),
        "store": store,
        "unique_for": _seconds(getattr(job, "unique_for", None), app_settings.DEFAULT_UNIQUE_FOR)
        if unique
        else "",
        "debounce_for": "" if unique else _seconds(getattr(job, "debounce_for", None)),
        "max_wait": "" if unique else _seconds(getattr(job, "max_wait", None)),
        "key_fields": key_fields(job),
        "on_duplicate": getattr(job, "on_duplicate", "") if unique else "",
        "flow": flow.option_lines(job),
        "concurrency": limit(job.concurrency),
        "throttle": limit(job.throttle),
        "throttle_key": throttle_key(job),
        "path": f"{type(job).__module__}.{type(job).__qualname__}",
    }


def describe_task(task: Any) -> dict[str, Any]:
    """K4: a unique or debounced Django task, in the columns of a job (its kind says the
    framework)."""
    options = task.dedup
    try:
        store = options.store_alias()
    except Exception as exc:
        store = f"error: {exc}"
    debounced = hasattr(options, "debounce_for")
    if hasattr(options, "throttle_on"):
        return _throttled_task(task, store)
    hook = options.debounce_id if debounced else options.unique_id
    fields = options.debounce_on if debounced else options.unique_on
    if hook is not None:
        key = "debounce_id()" if debounced else "unique_id()"
    elif fields:
        key = ", ".join(fields)
    else:
        names = list(options.signature.parameters)
        key = f"all arguments ({', '.join(names)})" if names else "no arguments (one key)"
    return {
        "name": options.label, "kind": django_tasks.kind_label(task), "store": store,
        "unique_for": "" if debounced else _seconds(options.unique_for,
                                                    app_settings.DEFAULT_UNIQUE_FOR),
        "debounce_for": _seconds(options.debounce_for) if debounced else "",
        "max_wait": _seconds(options.max_wait) if debounced else "",
        "key_fields": key, "on_duplicate": "" if debounced else options.on_duplicate,
        "flow": [], "concurrency": "", "throttle": "", "throttle_key": "",
        "path": f"{options.label} (backend {task.backend!r})",
    }


def _throttled_task(task: Any, store: str) -> dict[str, Any]:
    options = task.dedup
    by = ("throttle_id()" if options.throttle_id is not None
          else ", ".join(options.throttle_on or ()) or "the task alone (one limit)")
    return {
        "name": options.label, "kind": django_tasks.kind_label(task), "store": store,
        "unique_for": "", "debounce_for": "", "max_wait": "", "key_fields": by,
        "on_duplicate": "", "flow": [], "concurrency": limit(options.concurrency or None),
        "throttle": limit(options.throttle), "throttle_key": f"per throttle key: {by}",
        "path": f"{options.label} (backend {task.backend!r})",
    }


class JobClassAdmin(PageAdmin):
    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        rows = [describe(job) for job in registry.dedup_jobs()]
        rows += [describe_task(task) for task in django_tasks.unique_tasks()]
        context = self.page_context(request, "Job classes", rows=rows, **(extra_context or {}))
        return TemplateResponse(request, "admin/dedup_jobs/job_classes.html", context)
