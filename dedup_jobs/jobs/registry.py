"""The dedup jobs a process knows: every DedupJob registered with the current Celery app.

The admin and ``clear_stale_locks`` run in web/management processes, where Celery has not
imported the projects' task modules yet: the first call imports them (``autodiscover_tasks``
and ``imports``), as a worker does at start-up.
"""

from __future__ import annotations

import threading
from typing import Any

from celery import current_app

from dedup_jobs.conf import app_settings
from dedup_jobs.jobs.base import DedupJob

_imported: set[int] = set()
_lock = threading.Lock()


def celery_app() -> Any:
    """The project's Celery app. ``current_app`` is per thread: in a thread that never set
    it (a web server's worker thread) it is the default app. That is the project's own where
    the project called ``app.set_default()``; else it is Celery's unconfigured fallback
    (named "default", made on first use), so take another live app (Celery keeps them in a
    WeakSet: with several, any of them)."""
    from celery import _state

    state: Any = _state  # private in celery-types; stable since Celery 3
    mine = state._tls.current_app
    if mine is not None:
        return mine
    default = state.default_app
    if default is not None and not _celery_fallback(default):
        return default
    apps = [app for app in state._get_active_apps() if app is not default]
    return apps[0] if apps else current_app._get_current_object()  # type: ignore[attr-defined]


def _celery_fallback(app: Any) -> bool:
    """Is ``app`` the one Celery makes when nothing set a default (``celery._state``:
    ``Celery('default', fixups=[], set_as_current=False)``)?"""
    return app.main == "default" and not app.fixups


def dedup_jobs() -> list[DedupJob]:
    """Every registered dedup job, sorted by name."""
    app = celery_app()
    if id(app) not in _imported:
        with _lock:
            if id(app) not in _imported:
                app.loader.import_default_modules()
                _imported.add(id(app))
    tasks = list(app.tasks.values())
    return sorted((t for t in tasks if isinstance(t, DedupJob)), key=lambda t: str(t.name))


def job_named(name: str) -> DedupJob | None:
    return next((job for job in dedup_jobs() if job.name == name), None)


def kind_label(job: DedupJob) -> str:
    """The job's base class as the user wrote it: UniqueJob, UniqueUntilProcessingJob,
    DebouncedJob, ThrottledJob (a class of the user's own that is none of them: its name)."""
    from dedup_jobs import DebouncedJob, ThrottledJob, UniqueJob, UniqueUntilProcessingJob

    bases: tuple[type[DedupJob], ...] = (UniqueUntilProcessingJob, UniqueJob, DebouncedJob,
                                         ThrottledJob)
    for base in bases:
        if isinstance(job, base):
            return str(base.__name__)
    return str(type(job).__qualname__)


def store_aliases(jobs: list[DedupJob]) -> list[str]:
    """The default store, every store a registered job uses, and the database store."""
    from dedup_jobs.stores import DATABASE

    aliases = [app_settings.STORE]
    for job in jobs:
        try:
            aliases.append(job.store_alias())
            if job.throttled():
                aliases.append(job.throttle_alias())
        except Exception:  # a failing via() is reported by the system checks
            continue
    aliases.append(DATABASE)
    return list(dict.fromkeys(aliases))
