"""What the halves of :class:`~dedup_jobs.stores.cache.CacheStore` (its flow and debounce
mixins) use of the store, typed once: each mixin subclasses :class:`CacheHost` for the type
checker only (``object`` at run time), so a call into the store is checked against the
signature here, and the store is checked to provide it."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from dedup_jobs.keys import JobKey
    from dedup_jobs.stores.cache_calls import DjangoCacheCalls
    from dedup_jobs.stores.memcached import MemcachedClient


class CacheHost(Protocol):
    alias: str
    calls: DjangoCacheCalls | MemcachedClient

    def deadline_ms(self) -> int: ...

    def _mutex(self, key: JobKey) -> AbstractContextManager[None]: ...

    def _value(self, key: JobKey, owner: str, state: str, now: float, ttl: float,
               acquired: float | None = None) -> dict[str, Any]: ...

    def _in_time(self, deadline_ms: int) -> None: ...

    def _tombstone_seconds(self) -> float: ...
