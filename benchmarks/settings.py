"""Django settings of the benchmark: one Redis is broker and store for every contender."""

from __future__ import annotations

import os

REDIS_URL = os.environ.get(
    "DEDUP_JOBS_BENCH_REDIS", os.environ.get("DEDUP_JOBS_TEST_REDIS", "redis://127.0.0.1:6379")
)
QUEUE = os.environ.get("DEDUP_JOBS_BENCH_QUEUE", os.environ.get("DEDUP_JOBS_TEST_QUEUE", "bench"))
#: Redis databases of the benchmark (the test suite uses 9-12)
BROKER_DB, STORE_DB, RESULT_DB = 13, 14, 15

SECRET_KEY = "benchmarks-only"
DEBUG = False
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "dedup_jobs"]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": f"{REDIS_URL}/{STORE_DB}",
    },
    # Django's own Redis backend on the same database: UniqueJob measured on it too
    "django_redis_cache": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": f"{REDIS_URL}/{STORE_DB}",
    },
}
DEDUP_JOBS = {"STORE": "default", "LEASE_SECONDS": float(os.environ.get("BENCH_LEASE", "3"))}

CELERY_BROKER_URL = f"{REDIS_URL}/{BROKER_DB}"
CELERY_RESULT_BACKEND = None
SILENCED_SYSTEM_CHECKS = ["dedup_jobs.W002"]
