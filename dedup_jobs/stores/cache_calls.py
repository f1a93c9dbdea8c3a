"""The cache calls of the generic cache store on any Django cache (memcached has its own:
:mod:`dedup_jobs.stores.memcached`): what :class:`~dedup_jobs.stores.cache.CacheStore`
decides through."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

from django.core.cache import caches


class DjangoCacheCalls:
    """The cache calls of the store on any Django cache, through the cache API of the
    calling thread (``caches[alias]``: Django's clients are per thread). No ``cas``: a guarded
    write is a plain write, and always "done"."""

    def __init__(self, alias: str) -> None:
        self.alias = alias

    @property
    def cache(self) -> Any:
        return caches[self.alias]

    def decision(self) -> AbstractContextManager[None]:
        return nullcontext()

    def add(self, name: str, value: Any, ttl: float) -> bool:
        return bool(self.cache.add(name, value, ttl))

    def get(self, name: str) -> Any:
        return self.cache.get(name)

    def gets(self, name: str) -> tuple[Any, Any]:
        return self.cache.get(name), None

    def cas(self, name: str, value: Any, token: Any, ttl: float) -> bool | None:
        self.cache.set(name, value, ttl)
        return True

    def cas_delete(self, name: str, token: Any) -> bool | None:
        self.cache.delete(name)
        return True

    def set_many(self, values: dict[str, Any], ttl: float) -> None:
        self.cache.set_many(values, ttl)

    def get_many(self, names: list[str]) -> dict[str, Any]:
        found: dict[str, Any] = self.cache.get_many(names)
        return found

    def delete_many(self, names: list[str]) -> None:
        self.cache.delete_many(names)

    def close(self) -> None:
        return None
