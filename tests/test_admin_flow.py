"""The admin's view of flow control (SPEC A1 with R1-R3): *Held locks* says which locks
belong to jobs that replace, avoid overlap or only observe, and marks a running marker;
*Job classes* shows ``on_duplicate``, ``without_overlapping`` and the observe-only mode in
effect (the job's own option, else ``DEDUP_JOBS["OBSERVE_ONLY"]``)."""

from __future__ import annotations

import re

import pytest
from django.conf import settings
from django.test import override_settings

from dedup_jobs import clock
from dedup_jobs.stores import get_store
from dedup_jobs.stores.base import running_key
from tests import admin_helpers, jobs, jobs_flow
from tests.test_admin import CLASSES, LOCKS, login

listed_store = admin_helpers.listed_store_main  # the fixture: django-redis and the database


def rows_of(html: str) -> dict[str, list[str]]:
    """The held-locks rows by job name (a job may have several rows)."""
    body = html.replace("<wbr>", "").split("<tbody>", 1)[1].split("</tbody>", 1)[0]
    found: dict[str, list[str]] = {}
    for row in re.findall(r"<tr>(.*?)</tr>", body, re.S):
        name = re.search(r'<th class="field-job">([^<]+)<', row)
        assert name, row
        found.setdefault(name.group(1), []).append(row)
    return found


def badges(row: str) -> list[str]:
    return re.findall(r'<span class="flow-badge [^"]*" title="[^"]*">([^<]+)</span>', row)


def test_held_locks_show_the_flow_control_of_each_job(listed_store: str) -> None:
    """A1, R1, R2: the lock of a replace job carries a "replace" badge, the queued lock of a
    without_overlapping job a "no overlap" badge and its running marker is labelled, the lock
    of an observe-only job (R3) an "observe-only" badge; a plain job's lock carries none."""
    jobs.unique_sleep.delay(1)
    jobs_flow.replace_latest.delay(3, value=1)
    jobs_flow.observed.delay(4)
    store = get_store(listed_store)
    key = jobs_flow.no_overlap.job_key((5,), {})
    now = clock.now()
    # A run of key 5 in progress (its marker taken by the worker check) and a copy queued.
    assert store.acquire(key, "running-one", 60, now=now).acquired
    assert store.start_exclusive(key, running_key(key), "running-one", 60, now=now).run
    queued = jobs_flow.no_overlap.delay(5)
    rows = rows_of(login("viewer", "view_joblock").get(LOCKS).content.decode())
    assert badges(rows["tests.unique_sleep"][0]) == []
    assert badges(rows["tests.replace_latest"][0]) == ["replace"]
    assert badges(rows["tests.observed"][0]) == ["observe-only"]
    overlap = rows["tests.no_overlap"]
    assert len(overlap) == 2
    assert all(badges(row) == ["no overlap"] for row in overlap)
    marker = [row for row in overlap if "(run marker)" in row]
    assert len(marker) == 1 and "running-one" in marker[0]
    assert [row for row in overlap if queued.id in row] != marker


def test_held_locks_badge_follows_the_observe_only_setting(listed_store: str) -> None:
    """A1, R3: with DEDUP_JOBS["OBSERVE_ONLY"] every unique job's lock is marked
    observe-only, except a job whose own observe_only = False wins."""
    jobs.unique_sleep.delay(2)
    jobs_flow.replace_latest.delay(6, value=1)
    with override_settings(DEDUP_JOBS={**settings.DEDUP_JOBS, "OBSERVE_ONLY": True}):
        jobs_flow.replace_latest.observe_only = False
        try:
            rows = rows_of(login("viewer", "view_joblock").get(LOCKS).content.decode())
        finally:
            jobs_flow.replace_latest.observe_only = None
    assert badges(rows["tests.unique_sleep"][0]) == ["observe-only"]
    assert badges(rows["tests.replace_latest"][0]) == ["replace"]


def class_rows(html: str) -> dict[str, str]:
    return {
        m.group(1): m.group(2)
        for m in re.finditer(r"<th class=\"field-job\" title=\"[^\"]*\">([^<]+)</th>(.*?)</tr>",
                             html.replace("<wbr>", ""), re.S)
    }


def flow_lines(row: str) -> list[str]:
    match = re.search(r'<td class="flow">(.*?)</td>', row, re.S)
    assert match, row
    return re.findall(r"<div>([^<]*)</div>", match.group(1))


def on_duplicate(row: str) -> str:
    match = re.search(r'<td class="on-duplicate">([^<]*)</td>', row)
    assert match, row
    return match.group(1)


@pytest.mark.django_db
def test_job_classes_show_the_flow_control_options() -> None:
    """A1, R1-R3: Job classes shows on_duplicate (replace included) and, under Flow
    control, without_overlapping (and that it does nothing on a UniqueJob, W007) and the
    observe-only mode in effect: the job's own option, else DEDUP_JOBS["OBSERVE_ONLY"]; a
    DebouncedJob has none of them."""
    from tests import jobs_debounce  # noqa: F401 - registers the debounced jobs

    client = login("viewer", "view_joblock")
    rows = class_rows(client.get(CLASSES).content.decode())
    assert on_duplicate(rows["tests.replace_latest"]) == "replace"
    assert flow_lines(rows["tests.replace_latest"]) == []
    assert flow_lines(rows["tests.no_overlap"]) == ["without_overlapping"]
    assert flow_lines(rows["tests.observed"]) == ["observe_only"]
    assert flow_lines(rows["tests.unique_sleep"]) == []
    assert flow_lines(rows["tests.debounce_record"]) == []
    jobs.unique_sleep.without_overlapping = True
    try:
        with override_settings(DEDUP_JOBS={**settings.DEDUP_JOBS, "OBSERVE_ONLY": True}):
            jobs_flow.observed.observe_only = False
            try:
                rows = class_rows(client.get(CLASSES).content.decode())
            finally:
                jobs_flow.observed.observe_only = True
    finally:
        jobs.unique_sleep.without_overlapping = False
    assert flow_lines(rows["tests.unique_sleep"]) == [
        "without_overlapping (no effect: W007)", "observe-only (DEDUP_JOBS)"]
    assert flow_lines(rows["tests.observed"]) == ["observe_only = False (over DEDUP_JOBS)"]
    assert flow_lines(rows["tests.no_overlap"]) == [
        "without_overlapping", "observe-only (DEDUP_JOBS)"]
    assert flow_lines(rows["tests.debounce_record"]) == []


def test_held_locks_and_job_classes_show_cancel_running(listed_store: str) -> None:
    """A1, L2: the queued lock and the running marker of a cancel_running job carry a
    "cancel running" badge whose title says what happens to the run (asked to stop, or
    terminated); Job classes shows on_duplicate and, under Flow control, cancel_terminates."""
    store = get_store(listed_store)
    key = jobs_flow.cancel_latest.job_key((7,), {})
    now = clock.now()
    assert store.acquire(key, "running-seven", 60, now=now).acquired
    assert store.start_exclusive(key, running_key(key), "running-seven", 60, now=now).run
    jobs_flow.cancel_latest.delay(7)
    jobs_flow.cancel_terminating.delay(8)
    client = login("viewer", "view_joblock")
    rows = rows_of(client.get(LOCKS).content.decode())
    cancelling = rows["tests.cancel_latest"]
    assert len(cancelling) == 2 and all(badges(r) == ["cancel running"] for r in cancelling)
    assert "asked to stop" in cancelling[0]
    assert badges(rows["tests.cancel_terminating"][0]) == ["cancel running"]
    assert "is terminated" in rows["tests.cancel_terminating"][0]
    classes = class_rows(client.get(CLASSES).content.decode())
    assert on_duplicate(classes["tests.cancel_latest"]) == "cancel_running"
    assert flow_lines(classes["tests.cancel_latest"]) == []
    assert flow_lines(classes["tests.cancel_terminating"]) == ["cancel_terminates"]
