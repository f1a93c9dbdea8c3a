"""The tasks of ``benchmarks/django_tasks_enqueue.py``: one body, plain and unique on each
store (their backend: TASKS["default"], django-tasks-db's DatabaseBackend there)."""

from __future__ import annotations

from dedup_jobs.django_tasks import unique

try:
    from django.tasks import task  # type: ignore[import-not-found,unused-ignore]
except ImportError:
    from django_tasks import task  # type: ignore[no-redef,unused-ignore]


@task()
def plain(n: int) -> int:
    return n


@unique(unique_via="database")
@task()
def unique_database(n: int) -> int:
    return n


@unique(unique_via="redis")
@task()
def unique_redis(n: int) -> int:
    return n
