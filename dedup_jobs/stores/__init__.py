"""Store lookup: an alias is a CACHES alias, or "database" for the JobLock model."""

from __future__ import annotations

import threading
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from dedup_jobs.exceptions import InvalidJobConfiguration
from dedup_jobs.stores.base import BaseStore, LockInfo

__all__ = ["DATABASE", "BaseStore", "LockInfo", "get_store", "store_class_for"]

DATABASE = "database"
REDIS_BACKENDS = ("django_redis.cache.RedisCache",)

_stores: dict[str, BaseStore] = {}
_lock = threading.Lock()


def store_class_for(alias: str) -> type[BaseStore]:
    """The store class an alias resolves to; InvalidJobConfiguration if it names nothing."""
    if alias == DATABASE:
        from dedup_jobs.stores.database.store import DatabaseStore

        return DatabaseStore
    caches: dict[str, Any] = getattr(settings, "CACHES", {})
    if alias not in caches:
        raise InvalidJobConfiguration(
            f"dedup_jobs store {alias!r} is neither a CACHES alias ({sorted(caches)}) nor "
            f"'database'. Set unique_via/debounce_via or DEDUP_JOBS['STORE'] to one of them."
        )
    backend = caches[alias].get("BACKEND", "")
    if backend in REDIS_BACKENDS:
        from dedup_jobs.stores.redis import RedisStore

        return RedisStore
    from dedup_jobs.stores.cache import DUMMY_BACKEND, CacheStore

    if backend == DUMMY_BACKEND:
        raise InvalidJobConfiguration(
            f"dedup_jobs store {alias!r} is a DummyCache, which keeps nothing: every lock "
            f"would be lost at once. Point the job at a real cache or at 'database'."
        )
    return CacheStore


def get_store(alias: str) -> BaseStore:
    store = _stores.get(alias)
    if store is None:
        with _lock:
            store = _stores.get(alias)
            if store is None:
                store = _stores[alias] = store_class_for(alias)(alias)
    return store


@receiver(setting_changed)
def _forget_stores(*, setting: str, **kwargs: Any) -> None:
    if setting in ("CACHES", "DEDUP_JOBS", "DATABASES"):
        with _lock:
            dropped = list(_stores.values())
            _stores.clear()
        for store in dropped:
            store.close()
