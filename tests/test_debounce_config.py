"""DebouncedJob options: errors at class creation (U0, A3), system checks E007/E008, and the
paths that are published as they are (eager mode, canvas, send_task)."""

from __future__ import annotations

from typing import Any

import pytest
from celery import group

from dedup_jobs import DebouncedJob, UniqueJob
from dedup_jobs.checks import check_debounce, check_jobs
from dedup_jobs.exceptions import InvalidJobConfiguration
from tests import jobs_debounce as jobs
from tests.workers import thread_worker


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"debounce_for": 2, "max_wait": 1}, "max_wait = 1 is less than debounce_for = 2"),
        ({"debounce_for": 0}, "debounce_for = 0 must be a number of seconds above 0"),
        ({"debounce_for": -1.5}, "debounce_for = -1.5 must be a number"),
        ({"debounce_for": "5"}, "debounce_for = '5' must be a number"),
        ({}, "debounce_for is not set"),
        ({"debounce_for": 1, "max_wait": "9"}, "max_wait = '9' must be a number"),
        ({"debounce_for": 1, "unique_for": 60}, "both unique and debounced"),
        ({"debounce_for": 1, "debounce_on": ("nope",)}, "names ['nope'], which run() does not"),
    ],
)
def test_bad_options_fail_at_class_creation(options: dict[str, Any], message: str) -> None:
    """D2/U0/A3: bad debounce options raise InvalidJobConfiguration naming the value when
    the class is created."""
    with pytest.raises(
        InvalidJobConfiguration,
        match=message.replace("[", r"\[")
        .replace("]", r"\]")
        .replace("(", r"\(")
        .replace(")", r"\)"),
    ):
        type("BadJob", (DebouncedJob,), {"name": "tests.bad", "run": lambda self, x: x, **options})


def test_unique_and_debounced_bases_fail() -> None:
    """U0: a class built on both UniqueJob and DebouncedJob is refused."""
    with pytest.raises(InvalidJobConfiguration, match="both unique and debounced"):
        type("Both", (UniqueJob, DebouncedJob), {"run": lambda self: None, "debounce_for": 1})


def test_good_options_are_accepted() -> None:
    """D2: max_wait equal to debounce_for, or no max_wait, is fine."""
    for options in ({"debounce_for": 1, "max_wait": 1}, {"debounce_for": 0.1}):
        job = type("Fine", (DebouncedJob,), {"run": lambda self: None, **options})
        assert job.debounce_for == options["debounce_for"]


def test_system_checks_report_changed_options(app: Any) -> None:
    """A3: options changed after class creation (e.g. by task_annotations) are reported:
    E008 for max_wait < debounce_for, E007 for a bad debounce_for; nothing otherwise."""
    task = app.tasks["tests.debounce_record"]
    assert [m.id for m in check_debounce()] == []
    task.max_wait = 0.5
    try:
        (message,) = check_debounce()
        assert message.id == "dedup_jobs.E008"
        assert "tests.debounce_record: max_wait = 0.5 is less than debounce_for = 1.0" in (
            message.msg
        )
        task.debounce_for = 0
        (message,) = check_debounce()
        assert message.id == "dedup_jobs.E007"
        assert check_jobs() == []  # the class is fine, so E005 stays quiet
    finally:
        del task.max_wait
        if "debounce_for" in vars(task):
            del task.debounce_for
    assert check_debounce() == []


def test_eager_mode_runs_at_once(app: Any) -> None:
    """Eager mode (task_always_eager) runs every dispatch at once, undebounced."""
    app.conf.task_always_eager = True
    try:
        assert [jobs.debounce_record.delay(1, v).get() for v in (1, 2)] == [1, 2]
    finally:
        app.conf.task_always_eager = False


@pytest.mark.redis
@pytest.mark.worker
def test_canvas_and_send_task_are_published_as_they_are(app: Any) -> None:
    """A dispatch inside a group (the group waits for that very message) and a headerless
    app.send_task are not debounced: each runs with its own arguments."""
    with thread_worker(app):
        assert group(jobs.debounce_record.s(6, v) for v in (1, 2)).delay().get(timeout=15) == [1, 2]
        assert app.send_task("tests.debounce_record", (6, 3)).get(timeout=15) == 3
    assert sorted(jobs.values("record")) == [[6, 1], [6, 2], [6, 3]]
