"""Settings for tests/test_doc_snippets.py: a minimal project plus one snippet of the docs.

The snippet (environment variable ``DEDUP_JOBS_SNIPPET``: the settings statements of one
```python block of README.md or docs/) runs here as it would at the end of a new project's
settings.py. ``{...}`` in a snippet means "yours, as it is": such an entry of CACHES or
DATABASES becomes this project's own (locmem cache, SQLite), and ``...`` in INSTALLED_APPS
this project's apps.
"""

from __future__ import annotations

import os

import pymysql

# The docs' MySQL snippets name Django's MySQL backend; PyMySQL stands in for mysqlclient,
# as docs/installation.md shows.
pymysql.install_as_MySQLdb()

SECRET_KEY = "doc-snippets-only"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
PROJECT_APPS = ["django.contrib.contenttypes", "django.contrib.auth"]
PROJECT_CACHE = {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
PROJECT_DATABASE = {"ENGINE": "django.db.backends.sqlite3",
                    "NAME": os.environ.get("DEDUP_JOBS_SNIPPET_DB", ":memory:")}
YOURS = {...}  # a snippet's placeholder for an entry it leaves as it is

INSTALLED_APPS = list(PROJECT_APPS)  # a snippet that names no apps: dedup_jobs is added below
CACHES = {"default": PROJECT_CACHE}
DATABASES = {"default": PROJECT_DATABASE}

exec(  # the point: the snippet, as a reader pastes it
    compile(os.environ["DEDUP_JOBS_SNIPPET"], os.environ["DEDUP_JOBS_SNIPPET_ORIGIN"], "exec")
)

INSTALLED_APPS = list(dict.fromkeys([*PROJECT_APPS, "dedup_jobs",
                                     *(a for a in INSTALLED_APPS if a is not ...)]))
CACHES = {alias: PROJECT_CACHE if entry == YOURS else entry for alias, entry in CACHES.items()}
DATABASES = {alias: PROJECT_DATABASE if entry == YOURS else entry
             for alias, entry in DATABASES.items()}
# Django 6.1's field checks ask a MySQL server for its version (a UUIDField's type): a
# snippet's example credentials become the test MariaDB's (root, no password, database test).
DATABASES = {alias: {**entry, "NAME": "test", "USER": "root", "PASSWORD": ""}
             if entry.get("ENGINE") == "django.db.backends.mysql" else entry
             for alias, entry in DATABASES.items()}
