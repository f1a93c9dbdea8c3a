"""Settings of the subprocess workers started by the worker-guard tests (tests/test_entry_paths.py,
tests/test_leases.py): the test settings plus a small lease, the guard jobs, a cache alias on a
dead Redis port (W4) and, on request, a short Redis visibility timeout (acks_late redelivery)."""

from __future__ import annotations

import os

from tests.settings import *  # noqa: F403
from tests.settings import CACHES, DEDUP_JOBS

#: a Redis URL where nothing listens: the "dead" store of the W4 test (tests/test_entry_paths.py)
DEAD_REDIS_URL = os.environ.get("DEDUP_JOBS_TEST_DEAD_REDIS", "redis://127.0.0.1:1")
DEAD_CACHE = {
    "BACKEND": "django_redis.cache.RedisCache",
    "LOCATION": f"{DEAD_REDIS_URL}/0",
    "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 0.5, "SOCKET_TIMEOUT": 0.5},
}

DEDUP_JOBS = {
    **DEDUP_JOBS,
    "LEASE_SECONDS": float(os.environ.get("DEDUP_JOBS_TEST_LEASE_SECONDS", "5")),
}
CACHES = {**CACHES, "dead": DEAD_CACHE}
CELERY_IMPORTS = ("tests.jobs_guard",)

_visibility = os.environ.get("DEDUP_JOBS_TEST_VISIBILITY")
if _visibility:
    # Redis broker: an unacked message of a killed worker comes back after this many seconds.
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "visibility_timeout": float(_visibility),
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
    }
