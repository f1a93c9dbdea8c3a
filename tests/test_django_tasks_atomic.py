"""The atomic enqueue (issue: Django tasks, point 4): with django-tasks-db's DatabaseBackend,
the task row and the lock stand or fall together. A failure injected at the lock's store call
(never sent; executed with its reply lost) or after both were written (a later receiver of
task_enqueued raises) leaves neither a row nor a lock, on SQLite and PostgreSQL, with the
database store on the rows' own database (one transaction) and with Redis (the lock undone
by its owner). The enqueuer killed between the lock and the commit:
tests/test_django_tasks_workers.py."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.test import override_settings

from dedup_jobs.exceptions import StoreUnavailable
from dedup_jobs.stores import get_store
from tests import django_tasks_jobs as tasks
from tests.django_tasks_jobs import task_enqueued

DATABASES = [
    pytest.param("default", marks=pytest.mark.django_db(transaction=True), id="sqlite"),
    pytest.param("postgres", marks=pytest.mark.postgres, id="postgres"),
]


class RowsOn:
    """Route django-tasks-db's rows to one database."""

    def __init__(self, alias: str) -> None:
        self.alias = alias

    def db_for_write(self, model: Any, **hints: Any) -> str | None:
        return self.alias if model._meta.app_label == "django_tasks_database" else None

    db_for_read = db_for_write


def rows(alias: str) -> list[str]:
    from django_tasks_db.models import DBTaskResult

    return [str(pk) for pk in DBTaskResult.objects.using(alias).values_list("id", flat=True)]


def faulty(store: Any, fate: str) -> Any:
    real = store.acquire

    def acquire(*args: Any, **kwargs: Any) -> Any:
        if fate == "unsent":
            raise StoreUnavailable(store.alias, "injected: never sent")
        real(*args, **kwargs)
        raise StoreUnavailable(store.alias, "injected: executed, reply lost")

    return acquire


def gone(store: Any, key: Any, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while store.get(key) is not None:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.mark.parametrize("fate", ["unsent", "lost", "after"])
@pytest.mark.parametrize("store_alias", ["database", "redis"])
@pytest.mark.parametrize("database", DATABASES)
def test_a_failure_leaves_neither_row_nor_lock(
    database: str, store_alias: str, fate: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    dedup = {"STORE": store_alias, "DATABASE_ALIAS": database}
    with override_settings(DEDUP_JOBS=dedup, DATABASE_ROUTERS=[RowsOn(database)]):
        on_db = tasks.indexed.using(backend="db")
        store = get_store(store_alias)
        key = on_db.dedup.key([21], {}, store)

        def fail_after(**kwargs: Any) -> None:
            raise RuntimeError("injected: after the row and the lock")

        if fate == "after":
            task_enqueued.connect(fail_after, weak=False)
        else:
            monkeypatch.setattr(store, "acquire", faulty(store, fate))
        try:
            with pytest.raises(StoreUnavailable if fate != "after" else RuntimeError,
                               match="injected"):
                on_db.enqueue(21)
        finally:
            task_enqueued.disconnect(fail_after)
            monkeypatch.undo()
        assert rows(database) == []
        assert gone(store, key), store.get(key)
        # and the next enqueue writes both
        result = on_db.enqueue(21)
        assert result.deduplicated is False
        assert rows(database) == [result.id]
        lock = store.get(key)
        assert lock is not None and lock.owner == result.id
        assert on_db.enqueue(21).id == result.id  # a duplicate meanwhile
        assert rows(database) == [result.id]
