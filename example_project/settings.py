"""Settings of the example shop.

Embedded defaults need no server at all: SQLite for the data *and* the locks (the
``"database"`` store), kombu's in-memory broker and an in-memory result backend, so that
``python manage.py demo`` runs a real Celery worker inside its own process.

Environment variables (all optional):

- ``DEDUP_JOBS_EXAMPLE_DB``: path of the SQLite file (default ``example_project/db.sqlite3``).
- ``DEDUP_JOBS_EXAMPLE_REDIS``: a Redis URL such as ``redis://127.0.0.1:6379``. Locks then
  live in a django-redis cache (db 0), and Celery uses Redis as broker (db 1) and result
  backend (db 2), as a production project would.
"""

from __future__ import annotations

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-project-not-for-production")
DEBUG = os.environ.get("DJANGO_DEBUG", "1") == "1"
ALLOWED_HOSTS = ["localhost", "127.0.0.1", "[::1]"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "dedup_jobs",
    "django_tasks_db",
    "example_project.shop",
]
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]
ROOT_URLCONF = "example_project.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
STATIC_URL = "static/"
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("DEDUP_JOBS_EXAMPLE_DB", str(BASE_DIR / "db.sqlite3")),
        # The demo writes from several threads at once: WAL lets readers run beside the
        # writer, and a write waits (up to "timeout" seconds) instead of failing.
        # IMMEDIATE transactions take the write lock up front, so they queue rather than
        # deadlock.
        "OPTIONS": {
            "timeout": 20,
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            "transaction_mode": "IMMEDIATE",
        },
    }
}

# Order confirmations are "sent" into django.core.mail.outbox, so the demo can count them.
EMAIL_BACKEND = os.environ.get(
    "DJANGO_EMAIL_BACKEND", "django.core.mail.backends.locmem.EmailBackend"
)
DEFAULT_FROM_EMAIL = "shop@example.com"

REDIS_URL = os.environ.get("DEDUP_JOBS_EXAMPLE_REDIS", "").rstrip("/")

if REDIS_URL:
    CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "locks": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": f"{REDIS_URL}/0",
            "KEY_PREFIX": "shop",
            "OPTIONS": {"SOCKET_TIMEOUT": 5, "SOCKET_CONNECT_TIMEOUT": 5},
        },
    }
    DEDUP_JOBS = {"STORE": "locks"}
    CELERY_BROKER_URL = f"{REDIS_URL}/1"
    CELERY_RESULT_BACKEND = f"{REDIS_URL}/2"
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    # Locks in the JobLock table of the SQLite database: nothing else to run.
    DEDUP_JOBS = {"STORE": "database"}
    # kombu's in-memory transport: messages pass between threads of one process, which is
    # what the demo's in-process worker needs. A real deployment uses Redis or RabbitMQ.
    CELERY_BROKER_URL = "memory://"
    CELERY_BROKER_TRANSPORT_OPTIONS = {"polling_interval": 0.05}
    CELERY_RESULT_BACKEND = "cache+memory://"

CELERY_TASK_DEFAULT_QUEUE = os.environ.get("DEDUP_JOBS_EXAMPLE_QUEUE", "shop")
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_RESULT_EXPIRES = 3600

# Django's own tasks (part 7 of the demo): rows in the same SQLite database, run by
# `python manage.py db_worker`.
TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}
