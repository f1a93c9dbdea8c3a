"""Pointing the lock store, and only the lock store, at a misbehaving Redis.

:func:`faulty_store` adds a CACHES alias (``"faulty"``) on a django-redis cache at a given URL
(a private server of :mod:`tests.faults.servers`, or a :mod:`tests.faults.proxy` in front of
it) and makes it ``DEDUP_JOBS["STORE"]``, with a short lease and a ``STORE_TIMEOUT``. The Celery
broker and result backend stay on the healthy test Redis of ``tests/settings.py``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.conf import settings
from django.test import override_settings

from dedup_jobs.exceptions import StoreUnavailable
from dedup_jobs.stores import get_store

FAULTY = "faulty"
#: the lock store's own client: it gives up on a silent server after this long
SOCKET_TIMEOUT = 0.5
#: DEDUP_JOBS["STORE_TIMEOUT"] (S8): every store call is bounded by it
STORE_TIMEOUT = 1.0
#: DEDUP_JOBS["LEASE_SECONDS"]: a running job's lock is renewed every LEASE_SECONDS / 3
LEASE_SECONDS = 3.0


def faulty_cache(location: str, *, socket_timeout: float = SOCKET_TIMEOUT) -> dict[str, Any]:
    return {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": location,
        "OPTIONS": {
            "SOCKET_TIMEOUT": socket_timeout,
            "SOCKET_CONNECT_TIMEOUT": socket_timeout,
        },
    }


@contextmanager
def faulty_store(
    location: str,
    *,
    alias: str = FAULTY,
    lease_seconds: float = LEASE_SECONDS,
    store_timeout: float = STORE_TIMEOUT,
    socket_timeout: float = SOCKET_TIMEOUT,
    **dedup: Any,
) -> Iterator[str]:
    """Within the block, ``alias`` is a django-redis cache at ``location`` and the default
    store of every job (``DEDUP_JOBS = {..., "STORE": alias, "STORE_TIMEOUT": store_timeout,
    "LEASE_SECONDS": lease_seconds, **dedup}``). Yields the alias."""
    caches = {**settings.CACHES, alias: faulty_cache(location, socket_timeout=socket_timeout)}
    options = {
        **settings.DEDUP_JOBS,
        "STORE": alias,
        "STORE_TIMEOUT": store_timeout,
        "LEASE_SECONDS": lease_seconds,
        **dedup,
    }
    with override_settings(CACHES=caches, DEDUP_JOBS=options):
        yield alias


def _probe(read: Any, attempts: float = 5.0) -> Any:
    """``read()``, retried while the store is still unavailable (a probe must not fail just
    because the store is slow to come back)."""
    deadline = time.monotonic() + attempts
    while True:
        try:
            return read()
        except StoreUnavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def lock_of(job: Any, *args: Any, **kwargs: Any) -> Any:
    """The LockInfo (or None) of ``job(*args, **kwargs)``'s key in its store."""
    key = job.job_key(args, kwargs)
    return _probe(lambda: get_store(job.store_alias()).get(key))


def burst_of(job: Any, *args: Any, **kwargs: Any) -> Any:
    """The DebounceState (or None) of ``job(*args, **kwargs)``'s debounce key."""
    key = job.job_key(args, kwargs)
    return _probe(lambda: get_store(job.store_alias()).get_debounce(key))


def until(predicate: Any, timeout: float, interval: float = 0.05) -> tuple[bool, float]:
    """Poll ``predicate`` for up to ``timeout`` s: (it became true, seconds it took)."""
    start = time.monotonic()
    while True:
        if predicate():
            return True, time.monotonic() - start
        if time.monotonic() - start > timeout:
            return False, time.monotonic() - start
        time.sleep(interval)
