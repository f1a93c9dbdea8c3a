"""Which Celery app the admin and ``clear_stale_locks`` read their jobs from
(``jobs/registry.py``, ``celery_app``), in a thread that never set a current app (a web
server's request thread)."""

from __future__ import annotations

import threading
import weakref
from typing import Any

import pytest
from celery import Celery, _state

from dedup_jobs.jobs import registry
from tests.celery_app import app as project_app


def _from_another_thread() -> Any:
    found: list[Any] = []
    thread = threading.Thread(target=lambda: found.append(registry.celery_app()))
    thread.start()
    thread.join(timeout=10)
    return found[0]


def test_the_app_the_project_made_the_default_beside_another_app() -> None:
    """The test suite's app calls ``set_default()``, as some projects do. A second app alive
    in the process (a library's, a test's) was picked instead, as if the default were
    Celery's own unconfigured fallback: the admin listed that app's jobs, and importing its
    task modules inside the request ran Django's system checks against every database (seen
    in CI on Django 6.1: "Database threaded connections to 'mariadb' are not allowed")."""
    assert _state.default_app is project_app
    other = Celery("another", set_as_current=False)
    try:
        assert other in _state._get_active_apps()
        assert _from_another_thread() is project_app
    finally:
        _state._apps.discard(other)


def test_celery_s_own_fallback_is_not_taken_for_the_project_s_app(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where nothing made the project's app the default, Celery's fallback app (``default``,
    made on first use of ``current_app``) is not it: the project's app is. The live apps are
    just those two here: another test's app still alive in this process would be as good a
    pick (Celery keeps its apps in a WeakSet, in no order)."""
    fallback = Celery("default", fixups=[], set_as_current=False)
    _state._apps.discard(fallback)
    monkeypatch.setattr(_state, "_apps", weakref.WeakSet([project_app, fallback]))
    kept = _state.default_app
    _state.default_app = fallback
    try:
        assert _from_another_thread() is project_app
    finally:
        _state.default_app = kept  # before the conftest's check of the default app
