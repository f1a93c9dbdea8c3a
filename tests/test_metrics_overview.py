"""A5 Overview: the admin page shows what every process counted once it is flushed: per-job
decisions and duplicates prevented, the busiest keys, store latency and errors, and decisions
per minute as inline SVG charts; the history stays bounded."""

from __future__ import annotations

import re

import pytest

from dedup_jobs import clock
from dedup_jobs.metrics import history, tally
from dedup_jobs.metrics.models import DAY, MINUTE, DecisionCount
from tests import jobs
from tests.test_admin import login

OVERVIEW = "/admin/dedup_jobs/overview/"

pytestmark = [pytest.mark.redis, pytest.mark.django_db]


def job_row(html: str, job: str) -> dict[str, int]:
    row = re.search(rf'<th class="field-job">{re.escape(job)}</th>(.*?)</tr>', html, re.S)
    assert row is not None, f"{job} not on the page"
    return {name: int(v) for name, v in re.findall(r'<td class="count (\w+)">(\d+)</td>',
                                                   row.group(1))}


def test_overview_shows_flushed_decisions() -> None:
    """A5: 12 dispatches of 3 keys (3 dispatched, 9 deduplicated), flushed: the Overview's
    row for the job says so, its busiest key carries 3 prevented, the store's calls and
    latency show, and both charts draw a line per outcome seen."""
    tally.take()
    for n in range(12):
        jobs.unique_sleep.delay(f"ov-{n % 3}")
    assert history.flusher.flush()
    html = login("viewer", "view_joblock").get(OVERVIEW).content.decode()
    row = job_row(html, "tests.unique_sleep")
    assert (row["prevented"], row["dispatched"], row["deduplicated"]) == (9, 3, 9)
    assert html.count("<svg viewBox") == 2
    assert html.count('<polyline class="outcome-deduplicated"') == 2
    keys = re.findall(r'<td class="ident">([^<]*)</td><td class="count">(\d+)</td>', html)
    assert sorted(int(c) for _, c in keys) == [3, 3, 3]
    store = re.search(r"<tr><td>redis</td><td class=\"count\">(\d+)</td>", html)
    assert store is not None and int(store.group(1)) == 12


def test_a_failed_flush_keeps_its_counts_and_history_is_pruned() -> None:
    """A5: counts of a flush that could not be written go with the next flush; buckets past
    their keep (minutes: a day) are pruned."""
    tally.take()
    tally.decision("tests.x", "ran", None)
    taken = tally.take()
    tally.give_back(taken)
    assert tally.take().decisions == taken.decisions
    old = int(clock.now() // MINUTE * MINUTE) - DAY - MINUTE
    DecisionCount.objects.create(resolution=MINUTE, start=old, job="tests.x", outcome="ran",
                                 count=1)
    history.prune(clock.now())
    assert not DecisionCount.objects.filter(start=old).exists()


@pytest.mark.django_db(transaction=True)
def test_the_flush_thread_writes_within_its_interval() -> None:
    """A5: a process's flush thread (started by its first decision) writes what it counted
    within METRICS_FLUSH_SECONDS, off the decision path."""
    from django.conf import settings
    from django.test import override_settings

    from tests.workers import wait_for

    tally.take()
    with override_settings(DEDUP_JOBS={**settings.DEDUP_JOBS, "METRICS_FLUSH_SECONDS": 0.3}):
        history.flusher._pid = 0  # as in a new process
        try:
            jobs.unique_sleep.delay("flushed-by-thread")
            jobs.unique_sleep.delay("flushed-by-thread")
            wait_for(lambda: DecisionCount.objects.filter(
                resolution=MINUTE, job="tests.unique_sleep", outcome="deduplicated").exists(),
                timeout=10)
        finally:
            history.flusher._pid = -1  # its loop ends at its next wake-up
            history.flusher._wake.set()
    row = DecisionCount.objects.get(resolution=MINUTE, job="tests.unique_sleep",
                                    outcome="dispatched")
    assert row.count == 1


def test_overview_is_listed_first_in_the_section() -> None:
    """A5: the app's section of the admin index lists the Overview first."""
    html = login("viewer", "view_joblock").get("/admin/").content.decode()
    names = re.findall(r'<th scope="row" id="dedup_jobs-[^"]*">\s*<a href="[^"]*"[^>]*>'
                       r'([^<]+)</a>', html)
    assert names == ["Activity overview", "Debounced jobs", "Held locks", "Job classes",
                     "Throttles"], names
