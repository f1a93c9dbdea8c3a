"""L1/L3 under bad values: a limit that depends on the call is refused by name before anything
is dispatched (a batch included), never leaves a lock or a slot behind (U4, T2), and a value
no store can keep is not reported as an outage. From a red-team of the dynamic limits; each
test failed before its fix."""

from __future__ import annotations

import math
import time
from typing import Any

import pytest

from dedup_jobs import DebouncedJob, ThrottledJob, UniqueJob
from dedup_jobs.clock import now
from dedup_jobs.exceptions import InvalidJobConfiguration, StoreUnavailable
from tests.test_dispatch import queued
from tests.workers import thread_worker

pytestmark = pytest.mark.redis


def _register(cls: type) -> Any:
    from tests.celery_app import app

    return app.register_task(cls())


def _eventually(condition: Any, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.parametrize("cap", [math.nan, 0, "soon"], ids=["nan", "zero", "string"])
def test_a_static_max_wait_beside_a_debounce_for_method_is_refused_by_name(cap: Any) -> None:
    """L1: with debounce_for a method, a static max_wait is still checked when the class is
    made (it was handed to the store at the first dispatch: a bare ValueError)."""
    with pytest.raises(InvalidJobConfiguration, match=f"max_wait = {cap!r}"):
        class BadCap(DebouncedJob):
            name = f"tests.limits_failures_bad_cap_{cap!s}"
            max_wait = cap

            def debounce_for(self, n: int = 0) -> float:
                return 1.0

            def run(self, n: int = 0) -> int:
                return n


class PlanUnique(UniqueJob):
    """T1 + L1: a unique job whose concurrency() is 0 (not a limit) for plan "bad"; a "good"
    run retries itself as "bad"."""

    name = "tests.limits_failures_plan_unique"
    unique_for = 600

    def concurrency(self, plan: str) -> int | None:
        return 0 if plan == "bad" else 1

    def run(self, plan: str) -> str:
        if plan == "good":
            raise self.retry(args=("bad",), countdown=0.05, max_retries=1)
        return plan


plan_unique = _register(PlanUnique)


class PlanDebounced(DebouncedJob):
    """L1 on a debounced kind: concurrency() is 0 for plan "bad"."""

    name = "tests.limits_failures_plan_debounced"
    debounce_for = 0.5

    def concurrency(self, plan: str, n: int = 0) -> int | None:
        return 0 if plan == "bad" else 1

    def run(self, plan: str, n: int = 0) -> int:
        return n


plan_debounced = _register(PlanDebounced)


@pytest.mark.parametrize("job", [plan_unique, plan_debounced], ids=["unique", "debounced"])
def test_a_bad_limit_method_on_a_unique_or_debounced_job_is_refused_at_dispatch(
        app: Any, job: Any) -> None:
    """L1: as on a ThrottledJob, a limit method's bad value raises at dispatch naming it,
    with nothing locked or published (it was refused only at the worker, after the lock)."""
    with pytest.raises(InvalidJobConfiguration, match=r"concurrency\(\) returned 0"):
        job.delay("bad")
    assert job.store().get(job.job_key(("bad",), {})) is None
    assert job.store().get_debounce(job.job_key(("bad",), {})) is None
    assert queued(app) == 0


def test_a_retry_into_a_bad_limit_fails_and_leaves_no_lock(app: Any) -> None:
    """U4 with L1: a retry whose new arguments give a bad limit fails at the worker's
    admission, and the lock the retry held goes with it (it stayed for unique_for, and every
    dispatch of the key meanwhile was deduplicated onto the failed task)."""
    store = plan_unique.store()
    key, retried = plan_unique.job_key(("good",), {}), plan_unique.job_key(("bad",), {})
    first = plan_unique.delay("good")
    with thread_worker(app):
        with pytest.raises(InvalidJobConfiguration, match=r"concurrency\(\) returned 0"):
            first.get(timeout=20)
        # the attempt's key (the retry has another) and the key the retry took
        assert _eventually(lambda: store.get(key) is None and store.get(retried) is None), (
            store.get(key), store.get(retried))
    again = plan_unique.delay("good")
    assert not again.deduplicated and again.id != first.id


class RetryElsewhere(UniqueJob):
    """A unique job whose run retries itself with arguments of another key."""

    name = "tests.limits_failures_retry_elsewhere"
    unique_for = 600

    def run(self, n: int) -> int:
        if n == 1:
            raise self.retry(args=(2,), countdown=0.05, max_retries=1)
        return n


retry_elsewhere = _register(RetryElsewhere)


def test_a_retry_with_arguments_of_another_key_releases_the_old_key(app: Any) -> None:
    """U4: a retry keeps its attempt's lock (same id, same key); one whose arguments give
    another key takes that key, and the attempt releases its own when it ends (it was kept
    running until LEASE_SECONDS, every dispatch of it deduplicated onto a run that was
    over). The retry's own key goes when the retry ends."""
    old, new = retry_elsewhere.job_key((1,), {}), retry_elsewhere.job_key((2,), {})
    first = retry_elsewhere.delay(1)
    with thread_worker(app):
        assert first.get(timeout=20) == 2
        store = retry_elsewhere.store()
        assert _eventually(lambda: store.get(old) is None and store.get(new) is None), (
            store.get(old), store.get(new))
    assert not retry_elsewhere.delay(1).deduplicated


def test_a_throttled_batch_with_a_bad_limit_for_a_later_call_dispatches_nothing(
        app: Any) -> None:
    """L3: every call is checked before anything is dispatched. The second call's
    throttle() returns '2 per second' (not Celery's rate syntax)."""
    from tests.jobs_throttle import per_plan_rate

    with pytest.raises(InvalidJobConfiguration, match="2 per second"):
        per_plan_rate.dispatch_many([(("free", 1), {}), (("bad", 2), {})])
    assert queued(app) == 0


def test_a_raise_batch_with_a_call_that_makes_no_key_dispatches_nothing(app: Any) -> None:
    """L3 on the one-by-one path of a unique job (on_duplicate = "raise"): the second call
    has no invoice_id, so no key; the first is neither locked nor published."""
    job = app.tasks["tests.recalculate_invoice"]
    with pytest.raises(TypeError):
        job.dispatch_many([((71,), {}), ((), {"note": "x"})])
    assert job.store().get(job.job_key((71,), {})) is None
    assert queued(app) == 0


class RetryAsVip(ThrottledJob):
    """L1 + T2: one run at a time per "free" plan, no limit for "vip"; a "free" run retries
    itself as "vip"."""

    name = "tests.limits_failures_retry_as_vip"
    throttle_on = ("plan",)

    def concurrency(self, plan: str) -> int | None:
        return None if plan == "vip" else 1

    def run(self, plan: str) -> str:
        if plan == "free":
            raise self.retry(args=("vip",), countdown=0.05, max_retries=1)
        return plan


retry_as_vip = _register(RetryAsVip)


def test_a_retry_whose_new_arguments_have_no_limit_frees_the_slot(app: Any) -> None:
    """T2 with L1: a retry keeps its attempt's slot (same id); one whose new arguments have
    no limit never admits or releases it, so the attempt frees it (it stayed until
    LEASE_SECONDS, and the next "free" call waited for it)."""
    store = retry_as_vip.store(retry_as_vip.throttle_alias())

    def running() -> dict[str, int]:
        page = store.throttle_page(offset=0, limit=10, task_name=retry_as_vip.name, now=now())
        return {s.ident: s.running for s in page.items if s.running}

    with thread_worker(app, pool="threads", concurrency=2):
        assert retry_as_vip.delay("free").get(timeout=20) == "vip"
        assert _eventually(lambda: running() == {}, timeout=5), running()


class HugeUniqueFor(UniqueJob):
    """L1: unique_for() answers a finite number of seconds no store can keep."""

    name = "tests.limits_failures_huge_unique_for"

    def unique_for(self, n: int) -> float:
        return 1e300

    def run(self, n: int) -> int:
        return n


huge_unique_for = _register(HugeUniqueFor)


def test_a_huge_unique_for_is_refused_by_name_not_reported_as_an_outage(app: Any) -> None:
    """L1: a lifetime no store can keep raises InvalidJobConfiguration naming it (it reached
    Redis and came back as StoreUnavailable, which ON_STORE_ERROR='enqueue' would publish
    without a lock)."""
    try:
        huge_unique_for.delay(1)
    except StoreUnavailable as exc:
        pytest.fail(f"reported as a store outage: {exc}")
    except InvalidJobConfiguration as exc:
        assert "1e+300" in str(exc) and "at most" in str(exc)
    else:
        pytest.fail("a lifetime of 1e300 s was accepted")
    assert queued(app) == 0
