"""System checks of the database store: its connection (E003, W004: DATABASE_ALIAS) and its
tables (E006, W003), registered beside :mod:`dedup_jobs.checks` (every id is listed in
docs/checks.md)."""

from __future__ import annotations

import inspect
from typing import Any

from django.conf import settings
from django.core import checks

from dedup_jobs.checks import _error, _store_aliases, _warning


def check_database_alias(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """The database store's statements run on DATABASE_ALIAS's connection: inside a request's
    transaction there (ATOMIC_REQUESTS), a lock is invisible to workers until the commit."""
    from dedup_jobs.conf import app_settings
    from dedup_jobs.stores import DATABASE

    if DATABASE not in _store_aliases():
        return []
    alias = app_settings.DATABASE_ALIAS
    databases = getattr(settings, "DATABASES", {})
    if alias not in databases:
        return [_error(3, f"DEDUP_JOBS['DATABASE_ALIAS'] = {alias!r} is not in DATABASES "
                          f"({sorted(databases)}).", "Name a configured database alias.")]
    if databases[alias].get("ATOMIC_REQUESTS"):
        return [_warning(4, f"The 'database' store writes locks through DATABASES[{alias!r}], "
                            f"which has ATOMIC_REQUESTS: a dispatch inside a request takes its "
                            f"lock inside the request's transaction, so workers wait for the "
                            f"commit and a rollback drops the lock.",
                         "Add a second DATABASES entry for the same database without "
                         "ATOMIC_REQUESTS and set DEDUP_JOBS['DATABASE_ALIAS'] to it, or "
                         "dispatch with delay_on_commit().")]
    return []



def check_migrations(app_configs: Any = None, databases: Any = None,
                     **kwargs: Any) -> list[checks.CheckMessage]:
    """The database store needs the JobLock and PendingDebounce tables (with --database):
    E006 when the database cannot be read, W003 when a table is missing."""
    from django.db import DatabaseError, connections

    from dedup_jobs.conf import app_settings
    from dedup_jobs.stores import DATABASE
    from dedup_jobs.stores.database.models import JobLock, PendingDebounce

    if DATABASE not in _store_aliases() or not databases:
        return []
    using = app_settings.DATABASE_ALIAS
    if using not in databases:
        return []
    try:
        tables = connections[using].introspection.table_names()
    except DatabaseError as exc:
        return [_error(6, f"The database store cannot read database {using!r}: {exc}",
                       "Check DATABASES and DEDUP_JOBS['DATABASE_ALIAS'].")]
    missing = [m._meta.db_table for m in (JobLock, PendingDebounce)
               if m._meta.db_table not in tables]
    if missing and not _migrate_will_create(using):
        # A warning, not an error: "migrate dedup_jobs" run on its own (not by the command
        # itself: see _migrate_will_create) must not be refused by the table it creates.
        return [_warning(3, f"The 'database' store is in use but table "
                          f"{', '.join(map(repr, missing))} is missing in database {using!r}.",
                       "Run: python manage.py migrate dedup_jobs")]
    return []


def _migrate_will_create(using: str) -> bool:
    """True while Django's ``migrate`` command (or a subclass) runs the system checks, which
    it does with the database-tagged ones before it migrates, and dedup_jobs has migrations
    not yet applied on ``using``: the tables it is about to create are not reported missing.
    The checks framework does not say which command runs it, hence the look up the stack."""
    from django.core.management.commands.migrate import Command as Migrate
    from django.db import connections
    from django.db.migrations.loader import MigrationLoader

    frame = inspect.currentframe()
    while frame is not None and not isinstance(frame.f_locals.get("self"), Migrate):
        frame = frame.f_back
    if frame is None:
        return False
    loader = MigrationLoader(connections[using], ignore_no_migrations=True)
    return any(app == "dedup_jobs" and (app, name) not in loader.applied_migrations
               for app, name in loader.graph.nodes)


def register() -> None:
    checks.register(check_database_alias, "dedup_jobs")
    checks.register(check_migrations, checks.Tags.database)
