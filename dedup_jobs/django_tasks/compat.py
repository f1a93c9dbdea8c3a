"""Django's task framework, wherever it comes from: ``django.tasks`` (Django 6.0+) and the
``django-tasks`` backport (``django_tasks``, Django 5.2) side by side. A project can have both
(Django 6 with the backport still installed for django-tasks-db): a task made by either is
wrapped, and the signals of both are listened to."""

from __future__ import annotations

import importlib
from dataclasses import make_dataclass
from functools import cache
from types import ModuleType
from typing import Any

#: the packages of the framework, newest first
PACKAGES = ("django.tasks", "django_tasks")


@cache
def frameworks() -> tuple[ModuleType, ...]:
    """The framework packages importable here (each with its ``signals`` module)."""
    found = []
    for name in PACKAGES:
        try:
            found.append(importlib.import_module(name))
            importlib.import_module(f"{name}.signals")
        except ImportError:
            continue
    return tuple(found)


def base_of(package: ModuleType) -> ModuleType:
    """The framework's ``base`` module (``Task``, ``TaskResult``, ``TaskResultStatus``)."""
    return importlib.import_module(f"{package.__name__}.base")


def package_of(task: Any) -> ModuleType:
    """The framework package ``task`` was made by."""
    for package in frameworks():
        if isinstance(task, base_of(package).Task):
            return package
    raise TypeError(
        f"{task!r} is not a task made by @task (django.tasks or the django-tasks backport): "
        f"put the dedup_jobs decorator above @task(...), e.g. @unique() on top of @task()."
    )


def signals() -> list[tuple[Any, Any]]:
    """``(task_enqueued, task_started)`` of every framework present."""
    return [(package.signals.task_enqueued, package.signals.task_started)
            for package in frameworks()]


def normalize(task: Any, args: Any, kwargs: Any) -> tuple[list[Any], dict[str, Any]]:
    """The arguments as the backend stores them (JSON-normalized, as ``TaskResult`` keeps
    them), so the enqueue and the worker build the key from the same values."""
    package = package_of(task).__name__
    # django.utils.json on Django 6.1, the backport's own utils
    where = "django.utils.json" if package == "django.tasks" else f"{package}.utils"
    normalize = importlib.import_module(where).normalize_json
    return normalize(list(args)), normalize(dict(kwargs))


def result_missing(task: Any) -> type[Exception]:
    """The framework's "no such result" exception (``TaskResultDoesNotExist``, or the
    older ``ResultDoesNotExist``)."""
    exceptions = importlib.import_module(f"{package_of(task).__name__}.exceptions")
    found = getattr(exceptions, "TaskResultDoesNotExist", None) or exceptions.ResultDoesNotExist
    assert isinstance(found, type)
    return found


def result_status(task: Any) -> Any:
    """The framework's ``TaskResultStatus``."""
    return base_of(package_of(task)).TaskResultStatus


_extended: dict[tuple[type, str, tuple[type, ...]], type] = {}


def extended(cls: type, name: str, annotation: type, spec: Any, *,
             mixins: tuple[type, ...] = (), module: str | None = None) -> type:
    """The frozen dataclass ``cls`` (a framework's ``Task`` or ``TaskResult``, or a
    backend's subclass) with one more field, ``name`` (``spec``: its ``dataclasses.field``),
    and ``mixins`` first in its bases; made once per class, field and mixins."""
    found = _extended.get((cls, name, mixins))
    if found is None:
        found = _extended[(cls, name, mixins)] = make_dataclass(
            cls.__name__, [(name, annotation, spec)], bases=(*mixins, cls), frozen=True,
            kw_only=True, namespace={"__module__": module or cls.__module__,
                                     "__qualname__": cls.__qualname__})
    return found
