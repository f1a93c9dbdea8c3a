"""L1: limits that depend on the call (SPEC §12): a ``concurrency`` or ``throttle`` method
taking the call's arguments, None meaning no limit for that call, on real prefork workers;
a bad value refused at dispatch, naming the job, the method and the value."""

from __future__ import annotations

import time
from ast import literal_eval
from typing import Any

import pytest
from django.test import override_settings

from dedup_jobs.exceptions import InvalidJobConfiguration
from tests import jobs, jobs_throttle
from tests.test_throttle_worker import QUEUE_ENV, _env, most_at_once, most_in_a_window
from tests.throttle_support import ServerCounts, admitted_at
from tests.workers import process_worker


def _records(name: str) -> list[Any]:
    return [literal_eval(value) for value in jobs.runs(name)]


def test_a_bad_limit_is_refused_at_dispatch_naming_it(app: Any) -> None:
    with pytest.raises(InvalidJobConfiguration) as raised:
        jobs_throttle.per_plan_rate.delay("bad")
    assert str(raised.value).startswith(
        "tests.per_plan_rate: throttle() returned '2 per second' for this call: throttle = "
        "'2 per second' is not a rate")
    assert "or None for no throttle limit for this call" in str(raised.value)


def test_a_class_with_only_a_limit_method_is_valid() -> None:
    from dedup_jobs.checks import check_throttle

    assert callable(jobs_throttle.per_plan_concurrency.concurrency)
    assert jobs_throttle.per_plan_concurrency.throttle is None
    assert [m.id for m in check_throttle() if "per_plan" in m.msg] == []


@pytest.mark.redis
def test_concurrency_per_plan_on_a_prefork_worker(app: Any) -> None:
    """3 "free" calls (concurrency() -> 1) never overlap; 3 "vip" calls (-> None) run side
    by side and never ask the store (no admission of their key on the server, MONITOR)."""
    dedup, env = _env("redis")
    counts = ServerCounts(store_db=9, broker_db=10,
                          queue=env.get(QUEUE_ENV) or app.conf.task_default_queue)
    results: list[Any] = []
    with override_settings(DEDUP_JOBS=dedup):
        task = jobs_throttle.per_plan_concurrency
        with process_worker(concurrency=4, env=env):
            task.delay("vip", tag=-1).get(timeout=60)

            def burst() -> None:
                results.extend(task.delay(plan, tag=i, seconds=1.0)
                               for i, plan in enumerate(["free", "vip"] * 3))
                assert sorted(r.get(timeout=60) for r in results) == list(range(6))

            counts.run(burst)
    runs = [r for r in _records("per_plan_concurrency") if r[1] >= 0]
    free = [(start, end) for plan, _tag, start, end in runs if plan == "free"]
    vip = [(start, end) for plan, _tag, start, end in runs if plan == "vip"]
    assert len(free) == len(vip) == 3
    assert most_at_once(free) == 1, free
    assert most_at_once(vip) >= 2, vip
    assert not [c for _at, c in counts.admissions if "vip" in c]
    assert len(admitted_at(counts.admissions, [r.id for r in results[0::2]])) == 3


@pytest.mark.redis
def test_rate_per_plan_on_a_prefork_worker(app: Any) -> None:
    """6 "free" calls (throttle() -> "2/s"): no 1-second window holds more than 2
    admissions; 6 "vip" calls (-> None) all run at once, without asking the store."""
    dedup, env = _env("redis")
    counts = ServerCounts(store_db=9, broker_db=10,
                          queue=env.get(QUEUE_ENV) or app.conf.task_default_queue)
    free: list[Any] = []
    vip: list[Any] = []
    with override_settings(DEDUP_JOBS=dedup):
        task = jobs_throttle.per_plan_rate
        with process_worker(concurrency=4, env=env):
            task.delay("vip", tag=-1).get(timeout=60)

            def burst() -> None:
                began = time.time()
                vip.extend(task.delay("vip", tag=10 + i) for i in range(6))
                free.extend(task.delay("free", tag=i) for i in range(6))
                assert [r.get(timeout=60) for r in vip] == list(range(10, 16))
                assert time.time() - began < 10
                assert [r.get(timeout=60) for r in free] == list(range(6))

            counts.run(burst)
    admitted = admitted_at(counts.admissions, [r.id for r in free])
    assert most_in_a_window(admitted, 1.0) <= 2, sorted(a - min(admitted) for a in admitted)
    assert not [c for _at, c in counts.admissions if "vip" in c]
