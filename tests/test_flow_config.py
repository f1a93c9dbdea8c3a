"""Flow-control options (R1-R3) at class creation and in the system checks (A3)."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import override_settings

from dedup_jobs import DebouncedJob, UniqueJob, UniqueUntilProcessingJob
from dedup_jobs.checks import check_flow, check_settings
from dedup_jobs.exceptions import InvalidJobConfiguration
from tests import jobs_flow


@pytest.mark.parametrize("option, value", [
    ("without_overlapping", True), ("observe_only", True), ("on_duplicate", "replace")])
def test_flow_options_on_a_debounced_job_fail_at_class_creation(option: str, value: Any) -> None:
    """R1-R3: the flow-control options belong to the unique kinds; on a DebouncedJob they
    raise InvalidJobConfiguration naming the option and the value."""
    with pytest.raises(InvalidJobConfiguration, match=f"{option} = {value!r}"):
        type("Bad", (DebouncedJob,), {"name": f"tests.bad_{option}", "debounce_for": 1,
                                       option: value, "run": lambda self: None})


@pytest.mark.parametrize("option, value", [
    ("on_duplicate", "latest"), ("without_overlapping", "yes"), ("observe_only", 1)])
def test_bad_flow_values_fail_at_class_creation(option: str, value: Any) -> None:
    """R1-R3: a bad value raises InvalidJobConfiguration naming it."""
    with pytest.raises(InvalidJobConfiguration, match=f"{option} = {value!r}"):
        type("Bad", (UniqueUntilProcessingJob,), {"name": f"tests.badv_{option}",
                                                  option: value, "run": lambda self: None})


def test_flow_checks_report_options_changed_after_creation(app: Any) -> None:
    """A3 / R1-R2: E010 for an on_duplicate changed to a bad value after the class was
    validated; W007 for without_overlapping on a UniqueJob (no effect there)."""
    app.finalize()
    task = jobs_flow.replace_latest
    original = task.on_duplicate
    task.on_duplicate = "latest"
    try:
        ids = {m.id for m in check_flow()}
    finally:
        task.on_duplicate = original
    assert "dedup_jobs.E010" in ids
    plain = app.tasks["tests.unique_sleep"]
    assert isinstance(plain, UniqueJob)
    plain.without_overlapping = True
    try:
        messages = [m for m in check_flow() if m.id == "dedup_jobs.W007"]
    finally:
        plain.without_overlapping = False
    assert messages and "tests.unique_sleep" in messages[0].msg
    assert not [m for m in check_flow() if m.id in ("dedup_jobs.E009", "dedup_jobs.E010")]


def test_observe_only_setting_must_be_a_boolean() -> None:
    """R3 / A3: DEDUP_JOBS['OBSERVE_ONLY'] that is not a bool is E003 naming the value."""
    with override_settings(DEDUP_JOBS={"OBSERVE_ONLY": "yes"}):
        messages = check_settings()
    assert [m.id for m in messages] == ["dedup_jobs.E003"]
    assert "'OBSERVE_ONLY'] = 'yes'" in messages[0].msg
