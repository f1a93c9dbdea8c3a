"""The import-linter contract that keeps the engine free of Celery and django.tasks reads
import statements (tools/importlinter_forbidden_names.py): what it sees and what it leaves."""

from __future__ import annotations

from tools.importlinter_forbidden_names import imported_names, matches

SOURCE = '''
from __future__ import annotations
import os, celery.exceptions as ce
from typing import TYPE_CHECKING
from dedup_jobs.keys import JobKey
from . import sibling

if TYPE_CHECKING:
    from django.tasks import Task
else:
    import billiard

def later():
    from django.tasks.base import TaskResult
'''


def test_every_absolute_import_is_read_with_its_line_but_type_checking_ones() -> None:
    names = imported_names(SOURCE)
    assert (3, "os") in names and (3, "celery.exceptions") in names
    assert (5, "dedup_jobs.keys.JobKey") in names
    assert (11, "billiard") in names  # the else branch of TYPE_CHECKING runs
    assert (14, "django.tasks.base.TaskResult") in names  # function-level
    assert not any(name.startswith("django.tasks") and line == 9 for line, name in names)
    assert not any("sibling" in name for _line, name in names)  # relative: the project's


def test_a_prefix_matches_whole_dotted_names_only() -> None:
    assert matches("django.tasks", "django.tasks")
    assert matches("django.tasks.base", "django.tasks")
    assert not matches("django.tasks_extra", "django.tasks")
    assert not matches("django.core.cache", "django.tasks")
    assert matches("celery.exceptions.Ignore", "celery")
    assert not matches("celery_once", "celery")
