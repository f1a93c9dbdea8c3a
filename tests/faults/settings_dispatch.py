"""Settings of the subprocess worker of tests/faults/test_dispatch_fates.py: the guard worker's
settings (tests/settings_guard.py), with the lock store on the Redis URL given in
``DEDUP_JOBS_TEST_FAULTY_STORE`` (a proxy in front of a private redis-server) as the default
store, its calls bounded as in tests/faults/store.py, and the jobs of those tests."""

from __future__ import annotations

import os

from tests.settings_guard import *  # noqa: F403
from tests.settings_guard import CACHES, CELERY_IMPORTS, DEDUP_JOBS

_timeout = 0.5  # tests.faults.store.SOCKET_TIMEOUT (not imported: settings load first)
CACHES = {
    **CACHES,
    "faulty": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": os.environ.get("DEDUP_JOBS_TEST_FAULTY_STORE", "redis://127.0.0.1:1/0"),
        "OPTIONS": {"SOCKET_TIMEOUT": _timeout, "SOCKET_CONNECT_TIMEOUT": _timeout},
    },
}
DEDUP_JOBS = {**DEDUP_JOBS, "STORE": "faulty", "STORE_TIMEOUT": 1.0}
CELERY_IMPORTS = (*CELERY_IMPORTS, "tests.faults.jobs_dispatch")
