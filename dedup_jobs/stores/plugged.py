"""Stores of your own, named by dotted path (issue 23): ``DEDUP_JOBS["STORES"]`` maps a store
alias to a :class:`~dedup_jobs.stores.base.BaseStore` subclass, as Django's ``CACHES`` names
a backend. An alias found there wins over a ``CACHES`` alias of the same name and over
``"database"``; the class is made with the alias (``cls(alias)``) and reads whatever else it
needs from the settings itself.

What the class must implement depends on the jobs that use it (the protocols of
:mod:`dedup_jobs.stores.protocols`); the system check E015 names what is missing, E004 a path
that does not import or a class that is not a store.
"""

from __future__ import annotations

from typing import Any

from django.utils.module_loading import import_string

from dedup_jobs.conf import app_settings
from dedup_jobs.exceptions import InvalidJobConfiguration
from dedup_jobs.stores.base import BaseStore

EXAMPLE = "'myapp.stores.MyStore'"


def plugged_class(alias: str) -> type[BaseStore] | None:
    """The class ``DEDUP_JOBS["STORES"]`` names for ``alias`` (None: none is named).
    InvalidJobConfiguration, naming the alias, the path and what to do, when the path does
    not import or names something that is not a BaseStore subclass."""
    stores = app_settings.STORES
    if alias not in stores:
        return None
    path = stores[alias]
    where = f"DEDUP_JOBS['STORES'][{alias!r}] = {path!r}"
    if not isinstance(path, str) or "." not in path:
        raise InvalidJobConfiguration(
            f"{where} is not a dotted path. Give the dotted path of a "
            f"dedup_jobs.stores.BaseStore subclass, e.g. {EXAMPLE}.")
    try:
        found: Any = import_string(path)
    except ImportError as exc:
        raise InvalidJobConfiguration(
            f"{where} cannot be imported ({exc}). Give the dotted path of a "
            f"dedup_jobs.stores.BaseStore subclass, e.g. {EXAMPLE}.") from exc
    if not (isinstance(found, type) and issubclass(found, BaseStore)):
        raise InvalidJobConfiguration(
            f"{where} names {found!r}, which is not a subclass of "
            f"dedup_jobs.stores.BaseStore. Subclass it and implement the protocols your jobs "
            f"use (dedup_jobs.stores.protocols).")
    return found
