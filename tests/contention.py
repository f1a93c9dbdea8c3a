"""Child-process side of the contention tests (imported by multiprocessing "spawn")."""

from __future__ import annotations

import os
from typing import Any

_barrier: Any = None


def init(
    barrier: Any, dedup: dict[str, Any], database: tuple[str, str] | None, form: str = "",
    caches: dict[str, Any] | None = None,
) -> None:
    """``database``: the (alias, test database name) the parent's test runs on; ``form``:
    the statement form the database store takes there, when not its own (e.g. MySQL 8's
    "duplicate_key_read" on MariaDB); ``caches``: CACHES entries of the parent's test (a
    memcached it started)."""
    global _barrier
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from django.conf import settings
    from django.db import connections

    settings.DEDUP_JOBS = dedup
    if caches:  # before any cache is made: Django reads CACHES once
        settings.CACHES = {**settings.CACHES, **caches}
    if database:
        alias, name = database
        settings.DATABASES[alias]["NAME"] = name
        connections[alias].settings_dict["NAME"] = name
    if form:
        from dedup_jobs.stores.database import statements

        statements.dialect = lambda connection: form
    import tests.celery_app  # noqa: F401 - binds the shared tasks to the test app

    _barrier = barrier


def burst(item: int, dispatches: int) -> list[bool]:
    """Wait for every process, then dispatch ``dispatches`` times; return which published."""
    from tests import jobs

    _barrier.wait(timeout=60)
    return [not jobs.unique_sleep.delay(item).deduplicated for _ in range(dispatches)]


def replace_burst(item: int, value: int) -> str:
    """R1: wait for every process, then dispatch one replacing copy; return its task id."""
    from tests import jobs_flow

    _barrier.wait(timeout=60)
    return str(jobs_flow.replace_latest.delay(item, value=value).id)
