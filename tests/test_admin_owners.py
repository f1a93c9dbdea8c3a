"""A1 owner links: Held locks shows an owner task id shortened (in full in its title) and
links it to DEDUP_JOBS["TASK_URL"] when set; a bad template is the system check E003."""

from __future__ import annotations

import re

import pytest
from django.conf import settings
from django.test import override_settings

from dedup_jobs.admin import owners
from dedup_jobs.checks import check_settings
from tests import jobs
from tests.test_admin import login

LOCKS = "/admin/dedup_jobs/joblock/"

pytestmark = [pytest.mark.redis, pytest.mark.django_db]


def test_owner_is_shortened_and_linked_to_task_url() -> None:
    """A1: with TASK_URL = "http://flower/task/{id}" the owner cell shows the id's first 8
    characters and links to the template filled with the full id; without it, no link."""
    result = jobs.unique_sleep.delay(7)
    client = login("viewer", "view_joblock")
    html = client.get(LOCKS).content.decode()
    cell = re.search(r'<td class="owner" title="([^"]*)">(.*?)</td>', html)
    assert cell is not None and cell.group(1) == result.id
    assert cell.group(2) == f"{result.id[:8]}…" and "<a" not in cell.group(2)
    with override_settings(DEDUP_JOBS={**settings.DEDUP_JOBS,
                                       "TASK_URL": "http://flower/task/{id}"}):
        html = client.get(LOCKS).content.decode()
    assert f'<a href="http://flower/task/{result.id}">{result.id[:8]}…</a>' in html


def test_links_without_results_app_or_template_are_none() -> None:
    """A1: neither TASK_URL nor django_celery_results: no owner is linked."""
    assert owners.links(["abc"]) == {}
    assert owners.short("owner-117") == "owner-117"


@pytest.mark.parametrize("value", ["http://flower/task/", "http://x/{task}/{id}", 5])
def test_bad_task_url_is_e003(value: object) -> None:
    """A3: a TASK_URL without {id}, with other braces, or not a string is E003, naming it."""
    with override_settings(DEDUP_JOBS={**settings.DEDUP_JOBS, "TASK_URL": value}):
        found = [m for m in check_settings() if "TASK_URL" in m.msg]
    assert [m.id for m in found] == ["dedup_jobs.E003"] and repr(value) in found[0].msg


@pytest.mark.parametrize("value", [-1, 61, "30", True])
def test_bad_metrics_settings_are_e003(value: object) -> None:
    """A3: METRICS_FLUSH_SECONDS out of 0..60 or not a number, METRICS not a bool: E003."""
    with override_settings(DEDUP_JOBS={**settings.DEDUP_JOBS, "METRICS_FLUSH_SECONDS": value,
                                       "METRICS": "yes"}):
        ids = sorted(m.msg.split("]")[0] for m in check_settings() if m.id.endswith("E003"))
    assert ids == ["DEDUP_JOBS['METRICS'", "DEDUP_JOBS['METRICS_FLUSH_SECONDS'"]


RESULTS_SCRIPT = """
import django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
from django_celery_results.models import TaskResult
from dedup_jobs.admin import owners
done = TaskResult.objects.create(task_id="done-task", status="SUCCESS")
links = owners.links(["done-task", "queued-task"])
print(links["done-task"] == f"/admin/django_celery_results/taskresult/{done.pk}/change/")
print(links["queued-task"])
"""


def test_owner_links_to_django_celery_results() -> None:
    """A1: with django_celery_results installed (and no TASK_URL), an owner whose result is
    stored links to that result's admin change page, one not stored yet to the results list
    searched for its id."""
    import os
    import subprocess
    import sys

    from tests.workers import ROOT

    out = subprocess.run([sys.executable, "-c", RESULTS_SCRIPT], cwd=ROOT, capture_output=True,
                         text=True, timeout=60,
                         env={**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings_results"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["True",
                                  "/admin/django_celery_results/taskresult/?q=queued-task"]
