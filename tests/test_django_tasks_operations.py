"""Operations treat unique Django tasks like Celery jobs (SPEC K4): the admin's Held locks
and Job classes pages, clear_stale_locks reading the owner's result from the task backend
(django-tasks-db here, in this process's test database), lock_released sent with the task
as sender."""

from __future__ import annotations

import io
import re
import time
import uuid
from typing import Any

import pytest
from django.core.management import call_command
from django.test import override_settings

from dedup_jobs import clock
from dedup_jobs.signals import lock_released
from tests import django_tasks_jobs as tasks
from tests.test_admin import CLASSES, LOCKS, login

pytestmark = pytest.mark.django_db(transaction=True)

on_db = tasks.indexed.using(backend="db")


def key_of(number: int) -> Any:
    return on_db.dedup.key([number], {}, on_db.dedup.store())


def clear() -> str:
    out = io.StringIO()
    call_command("clear_stale_locks", verbosity=2, stdout=out)
    return out.getvalue()


def test_clear_stale_locks_reads_the_task_backend() -> None:
    """A lock whose owner's result finished goes; one whose result is READY stays; one
    whose result does not exist goes once it is older than LEASE_SECONDS (an enqueue that
    died before its commit)."""
    from django_tasks_db.models import DBTaskResult

    store = on_db.dedup.store()
    pending = on_db.enqueue(41)
    done = on_db.enqueue(42)
    DBTaskResult.objects.filter(id=done.id).update(status="SUCCESSFUL")
    ghost = str(uuid.uuid4())
    assert store.acquire(key_of(43), ghost, 600, now=clock.now()).acquired
    senders: list[Any] = []

    def receiver(sender: Any, **kwargs: Any) -> None:
        senders.append((sender, kwargs["owner"], kwargs["reason"]))

    lock_released.connect(receiver)
    try:
        with override_settings(DEDUP_JOBS={"STORE": "redis", "LEASE_SECONDS": 1}):
            output = clear()
            assert store.get(key_of(42)) is None, output
            assert f"owner {done.id}: owner task finished (SUCCESSFUL)" in output
            assert store.get(key_of(41)).owner == pending.id
            assert store.get(key_of(43)).owner == ghost  # young: its enqueue may be committing
            deadline = time.monotonic() + 10
            while store.get(key_of(43)) is not None:
                assert time.monotonic() < deadline, output
                output = clear()
                time.sleep(0.1)
    finally:
        lock_released.disconnect(receiver)
    assert "owner task not found in its task backend" in output
    assert store.get(key_of(41)).owner == pending.id
    assert (tasks.indexed, done.id, "command") in senders  # K4: the task is the sender


def test_the_admin_shows_django_tasks() -> None:
    """Held locks marks a Django task's lock; Job classes lists the task with its kind."""
    result = on_db.enqueue(44)
    client = login("viewer", "view_joblock")
    html = client.get(LOCKS + "?store=redis").content.decode()
    row = re.search(r"<tr>\s*<th class=\"field-job\">(.*?)</tr>", html, re.S)
    assert row is not None, html
    assert "tests.django_tasks_jobs.indexed" in row.group(1).replace("<wbr>", "")
    assert "Django task" in row.group(1) and result.id[:8] in row.group(1)
    classes = client.get(CLASSES).content.decode().replace("<wbr>", "")
    found = re.search(r"tests\.django_tasks_jobs\.indexed</th>(.*?)</tr>", classes, re.S)
    assert found is not None
    assert "unique (Django task)" in found.group(1)
    assert "all arguments (product_id, note)" in found.group(1)
    until = re.search(r"tests\.django_tasks_jobs\.until_processing</th>(.*?)</tr>", classes,
                      re.S)
    assert until is not None and "unique until processing (Django task)" in until.group(1)


def test_job_classes_show_debounced_and_throttled_tasks() -> None:
    classes = login("viewer", "view_joblock").get(CLASSES).content.decode().replace("<wbr>", "")

    def row(name: str) -> str:
        found = re.search(rf"tests\.django_tasks_jobs\.{name}</th>(.*?)</tr>", classes, re.S)
        assert found is not None, name
        return found.group(1)

    debounced = row("debounced_tail")
    assert "debounced (Django task)" in debounced and '<td class="seconds">2\xa0s</td>' in debounced
    throttled = row("throttled_held")
    assert "throttled (Django task)" in throttled
    assert 'title="per throttle key: key">1</td>' in throttled


def test_a_debounced_tasks_burst_in_the_admin_and_clear_stale_locks() -> None:
    """Debounced jobs lists a Django task's pending burst. clear_stale_locks keeps an
    overdue burst whose task the backend still holds (a stopped worker: removing the burst
    would run the task with its first arguments), and removes it once that task is gone."""
    from django_tasks_db.models import DBTaskResult

    from tests.test_admin import DEBOUNCES

    burst = tasks.debounced_tail.enqueue("o", 1)
    tasks.debounced_tail.enqueue("o", 2)
    html = login("viewer", "view_joblock").get(DEBOUNCES + "?store=redis").content.decode()
    assert "tests.django_tasks_jobs.debounced_tail" in html.replace("<wbr>", "")
    store = tasks.debounced_tail.dedup.store()
    key = tasks.debounced_tail.dedup.key(["o", 1], {}, store)
    with override_settings(DEDUP_JOBS={"STORE": "redis", "LEASE_SECONDS": 0.5}):
        deadline = time.monotonic() + 15
        while "its Django task is still queued or running" not in (output := clear()):
            assert time.monotonic() < deadline, output  # overdue: due (2 s) + 0.5 s
            time.sleep(0.1)
        assert store.get_debounce(key) is not None
        DBTaskResult.objects.filter(id=burst.id).delete()  # its message is lost now
        output = clear()
    assert store.get_debounce(key) is None, output
