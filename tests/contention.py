"""Child-process side of the contention tests (imported by multiprocessing "spawn")."""

from __future__ import annotations

import os
from typing import Any

_barrier: Any = None


def init(barrier: Any, dedup: dict[str, Any], pg_name: str | None) -> None:
    global _barrier
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from django.conf import settings
    from django.db import connections

    settings.DEDUP_JOBS = dedup
    if pg_name:
        settings.DATABASES["postgres"]["NAME"] = pg_name
        connections["postgres"].settings_dict["NAME"] = pg_name
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
