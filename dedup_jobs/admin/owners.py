"""Where *Held locks* links an owner task id: ``DEDUP_JOBS["TASK_URL"]`` (e.g. Flower's
``/task/{id}``) when set, else django_celery_results' admin page of the task when that app
is installed (its change page once the result is stored, its changelist searched for the id
before), else nowhere. The id is shown shortened, in full in its title."""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import quote, urlencode

from django.apps import apps
from django.urls import NoReverseMatch, reverse

from dedup_jobs.conf import app_settings

#: characters of an owner id shown in the table (a UUID's first group)
SHORT = 8

RESULTS_APP = "django_celery_results"


def short(task_id: str) -> str:
    return task_id if len(task_id) <= SHORT + 1 else f"{task_id[:SHORT]}…"


def links(task_ids: Iterable[str]) -> dict[str, str]:
    """The link of each owner id that has one (at most one query, for a whole page)."""
    ids = [i for i in dict.fromkeys(task_ids) if i]
    template = app_settings.TASK_URL
    if template:
        return {i: template.format(id=quote(i, safe="")) for i in ids}
    if not ids or not apps.is_installed(RESULTS_APP):
        return {}
    try:
        changelist = reverse(f"admin:{RESULTS_APP}_taskresult_changelist")
    except NoReverseMatch:
        return {}  # installed without its admin
    task_result = apps.get_model(RESULTS_APP, "TaskResult")
    found = dict(task_result._default_manager.filter(task_id__in=ids).values_list("task_id", "pk"))
    return {
        i: reverse(f"admin:{RESULTS_APP}_taskresult_change", args=[found[i]]) if i in found
        else f"{changelist}?{urlencode({'q': i})}"
        for i in ids
    }
