"""Settings of the processes that enqueue and run Django tasks on django-tasks-db in
tests/test_django_tasks_workers.py (enqueuers, ``db_worker``): the task rows on their own
database (``DEDUP_TASKS_DB``: ``sqlite:<path>`` or ``postgres:<name>``), the lock store
``DEDUP_TASKS_STORE`` ("database": the rows' database, one transaction with them).

``DEDUP_TASKS_RQ``: a Redis URL; the "rq" backend (django-tasks-rq's RQBackend, run by a real
``rqworker`` in tests/test_django_tasks_rq.py) queues there."""

from __future__ import annotations

import os

from tests.settings import *  # noqa: F403
from tests.settings import PG_HOST

_kind, _, _name = os.environ.get("DEDUP_TASKS_DB", "sqlite:dedup_tasks.sqlite3").partition(":")
if _kind == "sqlite":
    DATABASES = {"default": {
        "ENGINE": "django.db.backends.sqlite3", "NAME": _name,
        # writers queue for the lock instead of failing at once; BEGIN IMMEDIATE takes the
        # write lock first, so a transaction never has to upgrade (and deadlock) on it
        "OPTIONS": {"timeout": 30, "transaction_mode": "IMMEDIATE"},
    }}
else:
    DATABASES = {"default": {
        "ENGINE": "django.db.backends.postgresql", "NAME": _name, "USER": "postgres",
        "HOST": PG_HOST, "PORT": 5432,
    }}

TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"},
         "db": {"BACKEND": "django_tasks_db.DatabaseBackend"}}
if _rq := os.environ.get("DEDUP_TASKS_RQ"):
    INSTALLED_APPS = [*INSTALLED_APPS, "django_rq"]  # noqa: F405
    RQ_QUEUES = {"default": {"URL": _rq, "DEFAULT_TIMEOUT": 120}}
    TASKS["rq"] = {"BACKEND": "django_tasks_rq.RQBackend", "QUEUES": ["default"]}
DEDUP_JOBS = {
    "STORE": os.environ.get("DEDUP_TASKS_STORE", "database"),
    "LEASE_SECONDS": float(os.environ.get("DEDUP_TASKS_LEASE", "60")),
    "METRICS_FLUSH_SECONDS": 0,
}
