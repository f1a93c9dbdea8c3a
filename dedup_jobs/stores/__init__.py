"""Store lookup: an alias is a CACHES alias, or "database" for the JobLock model."""

from __future__ import annotations

import threading
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from dedup_jobs.exceptions import InvalidJobConfiguration
from dedup_jobs.stores.base import BaseStore, LockInfo

__all__ = ["DATABASE", "BaseStore", "LockInfo", "get_store", "redis_fallback",
           "store_class_for"]

DATABASE = "database"
#: the Redis-protocol backends of S1 (subclasses of them count too: see redis/adapters.py)
REDIS_BACKENDS = (
    "django_redis.cache.RedisCache",
    "django.core.cache.backends.redis.RedisCache",
    "django_valkey.cache.ValkeyCache",
    "django_valkey.cluster_cache.cache.ClusterValkeyCache",
)

_stores: dict[str, BaseStore] = {}
_lock = threading.Lock()


def store_class_for(alias: str) -> type[BaseStore]:
    """The store class an alias resolves to; InvalidJobConfiguration if it names nothing:
    a class of ``DEDUP_JOBS["STORES"]`` (stores/plugged.py), the database store, or the
    store a ``CACHES`` backend calls for."""
    from dedup_jobs.stores.plugged import plugged_class

    plugged = plugged_class(alias)
    if plugged is not None:
        return plugged
    if alias == DATABASE:
        from dedup_jobs.stores.database.store import DatabaseStore

        return DatabaseStore
    caches: dict[str, Any] = getattr(settings, "CACHES", {})
    if alias not in caches:
        raise InvalidJobConfiguration(
            f"dedup_jobs store {alias!r} is neither a CACHES alias ({sorted(caches)}), nor "
            f"'database', nor a DEDUP_JOBS['STORES'] alias. Set unique_via/debounce_via or "
            f"DEDUP_JOBS['STORE'] to one of them."
        )
    backend = caches[alias].get("BACKEND", "")
    from dedup_jobs.stores.redis.adapters import adapter_for

    adapter = adapter_for(backend)
    if adapter is not None:
        problem = redis_fallback(alias, adapter.backend)
        if problem is None and adapter.cluster:
            from dedup_jobs.stores.redis.cluster import RedisClusterStore

            return RedisClusterStore
        if problem is None:
            from dedup_jobs.stores.redis import RedisStore

            return RedisStore
        from dedup_jobs.stores.redis.adapters import warn_fallback

        warn_fallback(alias, problem)  # loudly, and the check W006 says it too
    from dedup_jobs.stores.cache import DUMMY_BACKEND, CacheStore

    if backend == DUMMY_BACKEND:
        raise InvalidJobConfiguration(
            f"dedup_jobs store {alias!r} is a DummyCache, which keeps nothing: every lock "
            f"would be lost at once. Point the job at a real cache or at 'database'."
        )
    return CacheStore


def redis_fallback(alias: str, backend: str) -> str | None:
    """Why the Redis-protocol cache at ``alias`` cannot have the Redis store (None: it can).
    Only Django's own RedisCache can fail here: its client accessor is private."""
    from dedup_jobs.stores.redis.adapters import DJANGO_BUILTIN, django_client_problem

    if backend != DJANGO_BUILTIN:
        return None
    from django.core.cache import caches

    return django_client_problem(caches[alias])


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
