"""Throttle options (T1-T3) at class creation and in the system checks (A3), and the
throttle key (section 1: ``{KEY_PREFIX}:throttle:{task name}:{throttle id}``)."""

from __future__ import annotations

from typing import Any

import pytest

from dedup_jobs import DebouncedJob, ThrottledJob, UniqueJob, UniqueUntilProcessingJob
from dedup_jobs.checks import check_throttle
from dedup_jobs.engine.throttle import Rate, parse_rate
from dedup_jobs.exceptions import InvalidJobConfiguration, InvalidJobId
from tests import jobs_throttle


@pytest.mark.parametrize("base, extra", [
    (ThrottledJob, {}), (UniqueJob, {}), (UniqueUntilProcessingJob, {}),
    (DebouncedJob, {"debounce_for": 1})])
@pytest.mark.parametrize("option, value, words", [
    ("concurrency", 0, "concurrency = 0 must be a whole number"),
    ("concurrency", 1.5, "concurrency = 1.5 must be a whole number"),
    ("concurrency", True, "concurrency = True must be a whole number"),
    ("throttle", "fast", "throttle = 'fast' is not a rate"),
    ("throttle", "10/d", "throttle = '10/d' is not a rate"),
    ("throttle", "0/s", "throttle = '0/s' allows no start"),
    ("throttle", 10, "throttle = 10 is not a rate"),
    ("throttle_on", "account", "throttle_on = 'account' must be a tuple"),
])
def test_bad_throttle_options_fail_at_class_creation(
    base: type, extra: dict[str, Any], option: str, value: Any, words: str
) -> None:
    """T1-T3: a bad value raises InvalidJobConfiguration naming the option and the value,
    on every kind."""
    with pytest.raises(InvalidJobConfiguration, match=words.replace("(", r"\(")):
        limit = {} if option == "concurrency" else {"concurrency": 1}
        type("Bad", (base,), {"name": f"tests.bad_{option}", **limit, option: value, **extra,
                              "run": lambda self, account=1: None})


def test_throttle_on_names_arguments_of_run() -> None:
    """T1: throttle_on naming an argument run() does not take is refused, naming it."""
    with pytest.raises(InvalidJobConfiguration, match=r"throttle_on names \['tenant'\]"):
        type("Bad", (UniqueJob,), {"name": "tests.bad_on", "throttle_on": ("tenant",),
                                   "concurrency": 1, "run": lambda self, account: None})


def test_a_throttled_job_needs_a_limit() -> None:
    """T1: a ThrottledJob with neither concurrency nor throttle is a configuration error."""
    with pytest.raises(InvalidJobConfiguration, match="needs concurrency = N or throttle"):
        type("Bad", (ThrottledJob,), {"name": "tests.no_limit", "run": lambda self: None})


def test_rates_parse_as_celery_writes_them() -> None:
    """T3: "K/s", "K/m", "K/h" (Celery's rate syntax, spaces allowed)."""
    assert parse_rate("10/s") == Rate(limit=10, period=1.0)
    assert parse_rate(" 3 / m ") == Rate(limit=3, period=60.0)
    assert parse_rate("100/h") == Rate(limit=100, period=3600.0)
    assert str(parse_rate("100/h")) == "100/h"
    assert parse_rate(None) is None
    with pytest.raises(ValueError, match="'ten/s' is not a rate"):
        parse_rate("ten/s")


def test_throttle_keys() -> None:
    """T1 / section 1: keyed by throttle_on (here the account), by default the task name
    alone; separate from the unique id."""
    assert jobs_throttle.two_at_once.throttle_key((7,), {"tag": 3}).key == (
        "dedup_jobs:throttle:tests.two_at_once:account=7")
    assert jobs_throttle.five_per_second.throttle_key((), {"tag": 1}).key == (
        "dedup_jobs:throttle:tests.five_per_second:tests.five_per_second")
    job = jobs_throttle.unique_one_at_once
    assert job.job_key((1,), {}).key.startswith("dedup_jobs:unique:")
    assert job.throttle_key((1,), {}) == job.throttle_key((2,), {})


def test_throttle_id_hook_and_a_bad_id() -> None:
    """T1 / A4: throttle_id() chooses the id; one no store can hold is refused naming the
    job and the hook."""
    class PerTenant(ThrottledJob):
        name = "tests.per_tenant"
        concurrency = 3

        def throttle_id(self, tenant: str, **kw: Any) -> str:
            return tenant.lower()

        def run(self, tenant: str) -> None:
            return None

    job = PerTenant()
    assert job.throttle_key(("ACME",), {}).key == "dedup_jobs:throttle:tests.per_tenant:acme"
    with pytest.raises(InvalidJobId, match=r"throttle_id\(\)"):
        job.throttle_key(("a\x00b",), {})


def test_throttle_checks_report_values_changed_after_creation(app: Any) -> None:
    """A3 / T1-T3: E012 for a concurrency changed to 0, E013 for an unparsable rate, E014 for
    a throttled job on a store that cannot throttle (locmem), each naming job and value."""
    app.finalize()
    task = jobs_throttle.two_at_once
    assert not check_throttle()
    saved = task.concurrency, task.throttle, task.throttle_via
    try:
        task.concurrency, task.throttle = 0, "5 per second"
        messages = {m.id: m.msg for m in check_throttle()}
        task.concurrency, task.throttle, task.throttle_via = 2, None, "locmem"
        messages.update({m.id: m.msg for m in check_throttle()})
    finally:
        task.concurrency, task.throttle, task.throttle_via = saved
    assert "tests.two_at_once: concurrency = 0" in messages["dedup_jobs.E012"]
    assert "throttle = '5 per second'" in messages["dedup_jobs.E013"]
    assert "store 'locmem'" in messages["dedup_jobs.E014"]
