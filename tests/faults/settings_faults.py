"""Settings of the prefork subprocess workers of the worker-side fault tests
(tests/faults/test_worker_fates.py): the test settings with the lock store (and only the lock
store) on the cache alias "faulty" at ``DEDUP_JOBS_TEST_FAULTY_URL`` (a proxy in front of a
private redis-server, tests/faults/proxy.py), LEASE_SECONDS 3, STORE_TIMEOUT 1 (the values
of tests/faults/store.py, which cannot be imported here: it imports the store) and
``LIMITS_ON_STORE_ERROR`` from ``DEDUP_JOBS_TEST_LIMITS`` (unset: the library's default)."""

from __future__ import annotations

import os

from tests.settings import *  # noqa: F403
from tests.settings import CACHES, DEDUP_JOBS

_LIMITS = os.environ.get("DEDUP_JOBS_TEST_LIMITS")

CACHES = {
    **CACHES,
    "faulty": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": os.environ["DEDUP_JOBS_TEST_FAULTY_URL"],
        "OPTIONS": {"SOCKET_TIMEOUT": 1.0, "SOCKET_CONNECT_TIMEOUT": 1.0},
    },
}
DEDUP_JOBS = {
    **DEDUP_JOBS,
    "STORE": "faulty",
    "LEASE_SECONDS": 3.0,
    "STORE_TIMEOUT": 1.0,
    **({"LIMITS_ON_STORE_ERROR": _LIMITS} if _LIMITS else {}),
}
