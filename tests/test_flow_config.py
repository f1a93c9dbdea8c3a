"""Flow-control options (R1-R3) at class creation and in the system checks (A3)."""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings
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


def test_replace_without_a_result_to_mark_is_w008(app: Any) -> None:
    """R1 / A3: a replaced message is kept from running by its REVOKED result; with
    ignore_result = True, or no result backend, one that reaches a worker after the lock is
    free again runs: W008 names the job and why, and is gone with a result."""
    from celery.backends.base import DisabledBackend

    app.finalize()
    task = jobs_flow.replace_latest
    assert "dedup_jobs.W008" not in {m.id for m in check_flow()}
    task.ignore_result = True
    try:
        ignored = [m for m in check_flow() if m.id == "dedup_jobs.W008"]
    finally:
        task.ignore_result = False
    assert len(ignored) == 1
    assert "tests.replace_latest" in ignored[0].msg and "ignore_result = True" in ignored[0].msg
    backend = task.backend
    task.backend = DisabledBackend(app)
    try:
        disabled = [m for m in check_flow() if m.id == "dedup_jobs.W008"]
    finally:
        task.backend = backend
    assert len(disabled) == 1 and "no result backend is configured" in disabled[0].msg


@pytest.mark.parametrize("option, value", [("without_overlapping", "yes"),
                                           ("observe_only", 1)])
def test_flow_option_changed_to_a_non_bool_is_e011(app: Any, option: str, value: Any) -> None:
    """R2, R3 / A3: without_overlapping or observe_only set to something that is not a bool
    after the class was validated (task_annotations, code) is E011 naming job, option and
    value."""
    app.finalize()
    task = jobs_flow.no_overlap
    original = getattr(task, option)
    setattr(task, option, value)
    try:
        messages = [m for m in check_flow() if m.id == "dedup_jobs.E011"]
    finally:
        setattr(task, option, original)
    assert len(messages) == 1
    assert f"tests.no_overlap: {option} = {value!r} is not True or False." == messages[0].msg
    assert not [m for m in check_flow() if m.id == "dedup_jobs.E011"]


def test_observe_only_setting_beside_debounced_jobs_is_w009(app: Any) -> None:
    """R3 / A3: DEDUP_JOBS['OBSERVE_ONLY'] puts the unique kinds in observe-only mode, not a
    DebouncedJob, which still merges a burst into one run: W009 names the debounced jobs."""
    from tests import jobs_debounce

    app.finalize()
    assert "dedup_jobs.W009" not in {m.id for m in check_flow()}
    with override_settings(DEDUP_JOBS={**settings.DEDUP_JOBS, "OBSERVE_ONLY": True}):
        messages = [m for m in check_flow() if m.id == "dedup_jobs.W009"]
    assert len(messages) == 1
    assert jobs_debounce.debounce_record.name in messages[0].msg
    assert jobs_flow.replace_latest.name not in messages[0].msg
