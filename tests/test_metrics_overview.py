"""A5 Overview: the admin page shows what every process counted once it is flushed: per-job
decisions and duplicates prevented, the busiest keys, store latency and errors, and decisions
per minute as inline SVG charts; the history stays bounded."""

from __future__ import annotations

import re
import threading

import pytest

from dedup_jobs import clock, metrics
from dedup_jobs.metrics import history, tally
from dedup_jobs.metrics.models import (
    DAY,
    MINUTE,
    DecisionCount,
    KeyCount,
    StoreError,
    StoreLatency,
)
from tests import jobs
from tests.test_admin import login

OVERVIEW = "/admin/dedup_jobs/overview/"

pytestmark = [pytest.mark.redis, pytest.mark.django_db]


def _no_metrics_thread(*, start_again: bool) -> None:
    """Stop this process's metrics thread, waiting for it to end (never two at once over the
    tally). ``start_again``: the next decision starts one, as in a new process; else none
    starts (the thread another test started would flush what every test before counted
    as soon as a test sets METRICS_FLUSH_SECONDS, into rows these tests count)."""
    history.flusher._pid = -1  # its loop ends at its next wake-up
    history.flusher._wake.set()
    for thread in threading.enumerate():
        if thread.name == "dedup_jobs-metrics":
            thread.join(10)
            assert not thread.is_alive(), "the metrics thread did not stop"
    history.flusher._pid = 0
    metrics._thread_started = not start_again


@pytest.fixture(autouse=True)
def _only_this_tests_counts() -> None:
    """Each test counts from an empty history, with no metrics thread that could flush
    another test's counts meanwhile."""
    _no_metrics_thread(start_again=False)
    tally.take()
    for model in (DecisionCount, KeyCount, StoreLatency, StoreError):
        model.objects.all().delete()


def job_row(html: str, job: str) -> dict[str, int]:
    html = html.replace("<wbr>", "")
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
    keys = re.findall(r'<td class="ident"[^>]*>([^<]*)</td><td class="count prevented">(\d+)</td>',
                      html)
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
        _no_metrics_thread(start_again=True)  # as in a new process: none started yet
        try:
            jobs.unique_sleep.delay("flushed-by-thread")
            jobs.unique_sleep.delay("flushed-by-thread")
            wait_for(lambda: DecisionCount.objects.filter(
                resolution=MINUTE, job="tests.unique_sleep", outcome="deduplicated").exists(),
                timeout=10)
        finally:
            _no_metrics_thread(start_again=False)
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


def key_rows(html: str) -> list[tuple[str, int, int]]:
    """The busiest keys: (key, duplicates prevented, deferred), in the page's order."""
    return [(key, int(prevented), int(deferred)) for key, prevented, deferred in re.findall(
        r'<td class="ident"[^>]*>([^<]*)</td><td class="count prevented">(\d+)</td>'
        r'<td class="count deferred">(\d+)</td>', html)]


def test_each_column_counts_what_its_header_says() -> None:
    """A5: duplicates prevented = deduplicated + superseded + replaced + skipped, and
    nothing else; deferrals have their own column in the job's row and in the busiest keys
    (a throttle key with 154 deferrals is not 154 duplicates prevented); a ThrottledJob's
    dispatches are counted "dispatched"."""
    from tests import jobs_throttle

    tally.take()
    job = jobs_throttle.two_at_once.name
    for n in range(5):
        jobs_throttle.two_at_once.delay(n % 2)
    throttle_key = "dedup:throttle:tests.two_at_once:account=0"
    for _ in range(154):
        metrics.decision(job, "deferred", throttle_key)
    for outcome, count in (("deduplicated", 4), ("superseded", 3), ("replaced", 2),
                           ("skipped", 1), ("ran", 5)):
        for _ in range(count):
            metrics.decision(job, outcome, "dedup:unique:tests.two_at_once:x=1"
                             if outcome != "ran" else None)
    assert history.flusher.flush()
    html = login("viewer", "view_joblock").get(OVERVIEW).content.decode()
    row = job_row(html, job)
    assert (row["dispatched"], row["prevented"], row["deferred"], row["ran"]) == (5, 10, 154, 5)
    assert key_rows(html.replace("<wbr>", "")) == [
        (throttle_key, 0, 154), ("dedup:unique:tests.two_at_once:x=1", 10, 0)]


def test_the_recent_chart_follows_the_activity() -> None:
    """A5: decisions of the last two minutes are drawn over the last 2 minutes in 10-second
    bins (a burst 90 s ago and one now in bins of their own), not as one spike at the right
    edge of an empty hour; the day chart spans the day's activity (here: 3 hours)."""
    tally.take()
    now = clock.now()
    from dedup_jobs.metrics.tally import Taken

    earlier = Taken()  # a flush 90 s ago
    earlier.decisions[("tests.unique_sleep", "dispatched")] = 7
    history.write(earlier, now - 90)
    for _ in range(3):
        metrics.decision("tests.unique_sleep", "dispatched")
    assert history.flusher.flush()
    html = login("viewer", "view_joblock").get(OVERVIEW).content.decode()
    captions = re.findall(r"<figcaption><strong>([^<]+)</strong>: decisions per ([^(]+) \(peak "
                          r"(\d+)\)", html)
    assert captions[0] == ("Last 2 min", "10 s", "7"), captions
    assert captions[1][:2] == ("Last 3 h", "5 min"), captions
    recent = re.search(r'<polyline class="outcome-dispatched" points="([^"]+)"', html)
    assert recent is not None
    heights = [float(point.split(",")[1]) for point in recent.group(1).split()]
    assert len(heights) == 12  # 2 minutes of 10-second bins
    assert sum(1 for h in heights if h < max(heights)) == 2  # two bins above zero
