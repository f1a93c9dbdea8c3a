"""L1 time options as methods of the call (SPEC §12): ``unique_for``, ``debounce_for`` and
``max_wait`` computed from the call's arguments, None meaning what the attribute's None
means; a bad answer refused at dispatch, naming the job, the method and the value, with
nothing locked or queued. On the real Redis store and broker, with a worker."""

from __future__ import annotations

import html
import re
import time
from typing import Any

import pytest

from dedup_jobs.conf import app_settings
from dedup_jobs.exceptions import InvalidJobConfiguration
from dedup_jobs.stores.answers import DUE_TOLERANCE
from tests import jobs
from tests.jobs_limits import PerPlanDebounced, PerPlanUnique, per_plan_debounced, per_plan_unique
from tests.test_dispatch import queued
from tests.workers import thread_worker

pytestmark = pytest.mark.redis


def _lifetime(job: Any, *args: Any) -> float:
    lock = job.store().get(job.job_key(args, {}))
    assert lock is not None and lock.expires_at is not None
    return float(lock.expires_at - time.time())


def test_unique_for_per_call_sets_each_lock_s_lifetime(app: Any) -> None:
    per_plan_unique.delay("free", 1)
    per_plan_unique.delay("vip", 1)
    assert 100 < _lifetime(per_plan_unique, "free", 1) <= 120
    default = float(app_settings.DEFAULT_UNIQUE_FOR)
    assert default - 20 < _lifetime(per_plan_unique, "vip", 1) <= default
    assert default != 120.0  # the two lifetimes differ
    assert per_plan_unique.delay("free", 1).deduplicated is True
    assert queued(app) == 2


def test_a_bad_unique_for_is_refused_at_dispatch_naming_it(app: Any) -> None:
    with pytest.raises(InvalidJobConfiguration) as raised:
        per_plan_unique.delay("bad", 1)
    assert str(raised.value) == (
        "tests.per_plan_unique: unique_for() returned 'soon' for this call: it must be a "
        "number of seconds above 0. Return seconds, or None for the default expiry "
        "(DEFAULT_UNIQUE_FOR).")
    assert queued(app) == 0
    assert per_plan_unique.store().get(per_plan_unique.job_key(("bad", 1), {})) is None


def test_debounce_for_per_call_and_none_for_no_debounce(app: Any) -> None:
    """3 "free" dispatches (debounce_for() -> 1 s) are one burst: one run, the last
    arguments, no sooner than 1 s after the last dispatch; 3 "vip" dispatches (None) are
    not debounced: each runs."""
    with thread_worker(app, pool="threads", concurrency=4):
        free = [per_plan_debounced.delay("free", n) for n in range(2)]
        last = time.monotonic()  # before the last dispatch: its burst is due 1 s after it
        free.append(per_plan_debounced.delay("free", 2))
        vip = [per_plan_debounced.delay("vip", n) for n in range(3)]
        assert sorted(r.get(timeout=30) for r in vip) == [0, 1, 2]
        assert free[-1].get(timeout=30) == 2
        assert time.monotonic() - last >= 1.0 - DUE_TOLERANCE  # a timer may fire that early
    assert jobs.runs("per_plan_debounced:free") == ["2"]
    assert sorted(jobs.runs("per_plan_debounced:vip")) == ["0", "1", "2"]


def test_a_max_wait_below_debounce_for_is_refused_for_that_call(app: Any) -> None:
    with pytest.raises(InvalidJobConfiguration) as raised:
        per_plan_debounced.delay("short", 1)
    assert str(raised.value).startswith(
        "tests.per_plan_debounced: max_wait = 0.5 is less than debounce_for = 1.0 for this "
        "call")
    assert queued(app) == 0


def test_classes_with_time_methods_are_valid_and_shown_as_per_call() -> None:
    from dedup_jobs.admin.job_classes import describe
    from dedup_jobs.checks import check_debounce

    PerPlanUnique.validate_options()
    PerPlanDebounced.validate_options()
    assert [m for m in check_debounce() if "per_plan" in m.msg] == []
    assert describe(per_plan_unique)["unique_for"] == "per call"
    shown = describe(per_plan_debounced)
    assert (shown["debounce_for"], shown["max_wait"]) == ("per call", "per call")


# -- the same options as functions of a Django task's call (K1 + L1) ---------------------


@pytest.mark.django_db(transaction=True)
def test_django_task_unique_for_per_call() -> None:
    from tests import django_tasks_jobs as tasks

    task = tasks.per_plan_unique
    store = task.dedup.store()

    def lifetime(*args: Any) -> float:
        lock = store.get(task.dedup.key(list(args), {}, store))
        assert lock is not None and lock.expires_at is not None
        return float(lock.expires_at - time.time())

    assert task.enqueue("free", 1).deduplicated is False
    assert task.enqueue("vip", 1).deduplicated is False
    assert 100 < lifetime("free", 1) <= 120
    default = float(app_settings.DEFAULT_UNIQUE_FOR)
    assert default - 20 < lifetime("vip", 1) <= default
    assert task.enqueue("free", 1).deduplicated is True
    with pytest.raises(InvalidJobConfiguration) as raised:
        task.enqueue("bad", 1)
    assert str(raised.value).startswith(
        "tests.django_tasks_jobs.per_plan_unique: unique_for() returned 'soon' for this call")
    assert store.get(task.dedup.key(["bad", 1], {}, store)) is None


@pytest.mark.django_db(transaction=True)
def test_django_task_debounce_for_per_call() -> None:
    """A "free" burst of 3 is one task, due 1 s after its last enqueue; 3 "vip" enqueues
    are 3 tasks, due at once; a max_wait below debounce_for is refused for that call."""
    from tests import django_tasks_jobs as tasks

    task = tasks.per_plan_debounced
    free = [task.enqueue("free", n) for n in range(3)]
    assert [r.deduplicated for r in free] == [False, True, True]
    assert len({r.id for r in free}) == 1
    assert free[0].task.run_after is not None
    vip = [task.enqueue("vip", n) for n in range(3)]
    assert [r.deduplicated for r in vip] == [False] * 3 and len({r.id for r in vip}) == 3
    assert all(r.task.run_after is None for r in vip)
    with pytest.raises(InvalidJobConfiguration, match=re.escape(
            "max_wait = 0.5 is less than debounce_for = 1.0 for this call")):
        task.enqueue("short", 1)


@pytest.mark.django_db(transaction=True)
def test_the_admin_shows_each_key_s_limit_and_the_method_as_per_call(app: Any) -> None:
    """L1: the Throttles page lists the limit each live key was admitted under (a "free"
    call's 2/s, a "pro" call's 5/m, both from one throttle() method, admitted by a worker);
    Job classes shows the method as "per call"."""
    from dedup_jobs.admin.job_classes import describe
    from tests.jobs_throttle import per_plan_rate
    from tests.test_admin_throttles import THROTTLES, login, rows

    with thread_worker(app):
        assert per_plan_rate.delay("free", 1).get(timeout=30) == 1
        assert per_plan_rate.delay("pro", 2).get(timeout=30) == 2
    page = login("ops", "view_joblock").get(THROTTLES).content.decode()
    limits = {html.unescape(row[1]): row[2] for row in rows(page)
              if row[0] == "tests.per_plan_rate"}
    assert limits == {'plan="free"': "2/s", 'plan="pro"': "5/m"}, rows(page)
    assert describe(per_plan_rate)["throttle"] == "per call"
