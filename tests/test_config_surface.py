"""The configuration surface under bad input: settings checks that name the value instead of
raising, clear_stale_locks refusing bad options and a bad DATABASE_ALIAS by name, and signal
receivers that raise stopping no release or dispatch (docs/signals.md: send_robust). From a
red-team of that surface; each test failed before its fix."""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.test import override_settings

from dedup_jobs.checks import check_settings, check_stores, check_throttle
from dedup_jobs.checks_database import check_database_alias
from dedup_jobs.signals import lock_released
from dedup_jobs.stores import get_store
from tests import jobs, jobs_throttle
from tests.admin_helpers import fill

pytestmark = [pytest.mark.redis]


# -- checks ------------------------------------------------------------------------------

@pytest.mark.parametrize("url", ["http://flower:5555/task/{id}?q={id.hex}",
                                 "http://flower:5555/task/{id}?q={id[x]}"])
def test_task_url_with_a_bad_field_is_e003_not_a_crash(url: str) -> None:
    """A3 / docs/checks.md E003: a TASK_URL that is not a valid template is reported by
    name; the check itself must not raise."""
    with override_settings(DEDUP_JOBS={**settings.DEDUP_JOBS, "TASK_URL": url}):
        messages = check_settings()
    assert [m.id for m in messages] == ["dedup_jobs.E003"]
    assert "TASK_URL" in messages[0].msg


def test_unknown_keys_of_mixed_types_are_e002_not_a_crash() -> None:
    """E002: unknown keys are each reported; the check itself must not raise (here two
    unknown keys, one an int: a key typed without quotes next to a typo)."""
    dedup = {**settings.DEDUP_JOBS, "STOER": "redis", 1: "x"}
    with override_settings(DEDUP_JOBS=dedup):
        messages = check_settings()
    assert sorted(m.id for m in messages) == ["dedup_jobs.E002", "dedup_jobs.E002"]


def test_throttle_via_an_unknown_alias_is_reported(app: Any) -> None:
    """E004 / E014: a throttled job whose throttle_via names no store (a typo) is reported
    by some check, naming the alias; check_throttle skips it saying 'reported as E004', but
    check_stores never looks at throttle_via."""
    app.finalize()
    task = jobs_throttle.unique_one_at_once  # a UniqueJob with concurrency = 1
    saved = task.throttle_via
    try:
        task.throttle_via = "redsi"
        messages = [*check_stores(), *check_throttle()]
    finally:
        task.throttle_via = saved
    assert any("redsi" in m.msg for m in messages), [m.msg for m in messages]


def test_database_alias_checked_when_only_throttle_via_uses_the_database(app: Any) -> None:
    """E003 (DATABASE_ALIAS is not in DATABASES, 'only when the database store is in use'):
    a job throttled on 'database' uses the database store, but the check does not see it."""
    app.finalize()
    task = jobs_throttle.unique_one_at_once  # a UniqueJob with concurrency = 1
    saved = task.throttle_via
    dedup = {**settings.DEDUP_JOBS, "DATABASE_ALIAS": "nope"}
    try:
        task.throttle_via = "database"
        with override_settings(DEDUP_JOBS=dedup):
            messages = check_database_alias()
    finally:
        task.throttle_via = saved
    assert any("'nope'" in m.msg for m in messages), [m.msg for m in messages]


# -- clear_stale_locks ------------------------------------------------------------------

@pytest.mark.django_db(transaction=True)
def test_a_raising_lock_released_receiver_does_not_stop_clear_stale_locks() -> None:
    """docs/signals.md: every signal on the lock path is sent with send_robust: a receiver
    that raises is logged and cannot stop a release. clear_stale_locks --all --yes must
    remove all three locks and print its summary."""
    fill("redis", 3)

    def broken(sender: Any, **kwargs: Any) -> None:
        raise RuntimeError("receiver bug")

    lock_released.connect(broken, weak=False)
    out = io.StringIO()
    try:
        call_command("clear_stale_locks", "--all", "--yes", "--store", "redis",
                     "--job", "tests.unique_sleep", stdout=out)
    finally:
        lock_released.disconnect(broken)
    assert "3 held locks scanned: removed 3" in out.getvalue()
    assert not list(get_store("redis").iter_locks(batch_size=100))


@pytest.mark.django_db
@pytest.mark.parametrize("args", [["--inspect-timeout", "inf"], ["--inspect-timeout", "1e400"],
                                  ["--older-than", "inf"]])
def test_infinite_seconds_options_are_a_command_error(args: list[str]) -> None:
    """A2 / A4: a seconds option that is infinite is refused with a clear message (as -5,
    'nan' and 'soon' are), not accepted."""
    with pytest.raises(CommandError, match="seconds"):
        call_command("clear_stale_locks", "--dry-run", "--store", "redis", *args,
                     stdout=io.StringIO())


# keep the import used (registers tests.unique_sleep)
assert jobs.unique_sleep


@pytest.mark.django_db(transaction=True)
def test_a_raising_lock_released_receiver_does_not_stop_an_admin_release() -> None:
    """docs/signals.md: a lock_released receiver that raises is logged and cannot stop a
    release. The admin's release of two ticked locks must release both and redirect, not
    answer 500 after the first."""
    from tests.test_admin import LOCKS, login, selected_values

    fill("redis", 2)
    client = login("rt-releaser", "view_joblock", "release_joblock")
    client.raise_request_exception = False
    values = selected_values(client.get(LOCKS).content.decode())
    assert len(values) == 2

    def broken(sender: Any, **kwargs: Any) -> None:
        raise RuntimeError("receiver bug")

    lock_released.connect(broken, weak=False)
    try:
        done = client.post(LOCKS, {"action": "release_selected", "_selected_action": values,
                                   "post": "yes"})
    finally:
        lock_released.disconnect(broken)
    left = list(get_store("redis").iter_locks(batch_size=100))
    assert (done.status_code, len(left)) == (302, 0)


@pytest.mark.django_db(transaction=True)
def test_a_raising_job_debounced_receiver_does_not_fail_the_dispatch() -> None:
    """docs/signals.md (signals sent with send_robust; the Django-task debounce path sends
    job_debounced through notify): a raising job_debounced receiver must not make a
    dispatch that was absorbed into its burst raise to the caller."""
    from dedup_jobs.signals import job_debounced
    from tests import jobs_debounce

    task = jobs_debounce.debounce_fail
    task.delay(701, 1)

    def broken(sender: Any, **kwargs: Any) -> None:
        raise RuntimeError("receiver bug")

    job_debounced.connect(broken, weak=False)
    try:
        second = task.delay(701, 2)  # absorbed: the burst now runs with value=2
    finally:
        job_debounced.disconnect(broken)
    state = task.store().get_debounce(task.job_key((701, 2), {}))
    assert state is not None and (state.latest_id, state.count) == (second.id, 2)


@pytest.mark.django_db(transaction=True)
def test_clear_stale_locks_on_a_database_alias_not_in_databases_is_a_command_error() -> None:
    """A2: 'non-zero with a clear message on error': --store database while
    DEDUP_JOBS['DATABASE_ALIAS'] names no DATABASES entry is a CommandError naming it, not
    a traceback."""
    dedup = {**settings.DEDUP_JOBS, "DATABASE_ALIAS": "nope"}
    with override_settings(DEDUP_JOBS=dedup), pytest.raises(CommandError, match="nope"):
        call_command("clear_stale_locks", "--store", "database", stdout=io.StringIO())


@pytest.mark.django_db(transaction=True)
def test_plain_clear_stale_locks_with_a_bad_unused_database_alias() -> None:
    """A2 / E003: no job uses the database store, so the system checks (run first, as
    manage.py does: skip_checks=False) accept DATABASE_ALIAS = 'nope'; the command must then
    not fail with a traceback on the database store it scans by default."""
    dedup = {**settings.DEDUP_JOBS, "DATABASE_ALIAS": "nope"}
    with override_settings(DEDUP_JOBS=dedup), pytest.raises(CommandError, match="'nope'"):
        call_command("clear_stale_locks", "--dry-run", "--inspect-timeout", "0.3",
                     skip_checks=False, stdout=io.StringIO())


@pytest.mark.django_db(transaction=True)
def test_clear_stale_locks_before_migrate_is_a_command_error() -> None:
    """A2: the database store without its table (migrate not run on that database) is a
    CommandError naming the fix, not a DatabaseError traceback."""
    from django.db import connection

    with connection.schema_editor() as editor:
        from dedup_jobs.stores.database.models import JobLock

        editor.delete_model(JobLock)
    try:
        dedup = {**settings.DEDUP_JOBS, "STORE": "database"}
        with override_settings(DEDUP_JOBS=dedup), pytest.raises(CommandError):
            call_command("clear_stale_locks", "--store", "database", stdout=io.StringIO())
    finally:
        with connection.schema_editor() as editor:
            editor.create_model(JobLock)
