"""A store of a third party's own, outside the package (issue 23): named by dotted path in
``DEDUP_JOBS["STORES"]`` and run through the store contract suite like the package's stores.

:class:`ShardedStore` spreads its keys over two other stores (a team that splits its locks
between two servers would write this; here django-redis and Django's own RedisCache, each
with a prefix of its own): each logical key goes to one shard, chosen by a stable hash, and
every decision is that shard's one call. A lock and its running marker (``key`` and
``key:run``, passed together to ``start_exclusive``) go to the same shard. A decision's
deadline (S7) is this store's, whichever shard takes it. Listing merges the shards' pages. It
implements every protocol of :mod:`dedup_jobs.stores.protocols` by delegation, and subclasses
nothing of the package but :class:`~dedup_jobs.stores.base.BaseStore`.
"""

from __future__ import annotations

import heapq
import itertools
import zlib
from collections.abc import Iterator
from typing import Any

from dedup_jobs.keys import JobKey
from dedup_jobs.stores import store_class_for
from dedup_jobs.stores.base import (
    Acquired,
    Admission,
    BaseStore,
    Debounced,
    DebounceState,
    Due,
    LockInfo,
    Page,
    Renewed,
    Started,
    ThrottleState,
)

#: the shards' store aliases (two CACHES aliases)
SHARDS = ("redis", "djredis")


def _route(key: JobKey) -> str:
    base = key.key.removesuffix(":run")
    return SHARDS[zlib.crc32(base.encode()) % len(SHARDS)]


class ShardedStore(BaseStore):
    times_its_calls = True  # each shard times its own calls (no double count)
    can_list = True
    can_throttle = True

    def __init__(self, alias: str) -> None:
        super().__init__(alias)
        self._by_alias = {name: self._shard(name) for name in SHARDS}

    def _shard(self, name: str) -> BaseStore:
        shard = store_class_for(name)(name)
        # the decision's deadline is this store's (on the shard's clock)
        shard.deadline_ms = lambda: self.deadline_ms() + shard.skew_ms  # type: ignore[method-assign]
        return shard

    def _for(self, key: JobKey) -> BaseStore:
        return self._by_alias[_route(key)]

    def _shards(self) -> list[BaseStore]:
        return list(self._by_alias.values())

    def close(self) -> None:
        for shard in self._shards():
            shard.close()

    def key_problem(self, key: JobKey) -> str | None:
        return self._for(key).key_problem(key)

    # -- LockStore ------------------------------------------------------------------------

    def acquire(self, key: JobKey, owner: str, ttl: float, *, now: float,
                reentrant: bool = False, request: str | None = None) -> Acquired:
        return self._for(key).acquire(key, owner, ttl, now=now, reentrant=reentrant,
                                      request=request)

    def undo(self, key: JobKey, owner: str, request: str | None) -> bool:
        return self._for(key).undo(key, owner, request)

    def start(self, key: JobKey, owner: str, lease: float, *, now: float, release: bool,
              delivery: str | None = None, redelivered: bool = False) -> Started:
        return self._for(key).start(key, owner, lease, now=now, release=release,
                                    delivery=delivery, redelivered=redelivered)

    def release(self, key: JobKey, owner: str) -> bool:
        return self._for(key).release(key, owner)

    def renew(self, key: JobKey, owner: str, ttl: float, *, now: float,
              delivery: str | None = None) -> Renewed:
        return self._for(key).renew(key, owner, ttl, now=now, delivery=delivery)

    def get(self, key: JobKey) -> LockInfo | None:
        return self._for(key).get(key)

    # -- ReplaceStore, OverlapStore -------------------------------------------------------

    def take_over(self, key: JobKey, owner: str, ttl: float, *, now: float,
                  request: str | None = None) -> Acquired:
        return self._for(key).take_over(key, owner, ttl, now=now, request=request)

    def start_exclusive(self, key: JobKey, running: JobKey, owner: str, lease: float, *,
                        now: float, delivery: str | None = None) -> Started:
        return self._for(key).start_exclusive(key, running, owner, lease, now=now,
                                              delivery=delivery)

    # -- CancelStore (L2) -------------------------------------------------------------------

    def cancel_take(self, key: JobKey, running: JobKey, owner: str, ttl: float, *,
                    now: float, request: str | None = None) -> Acquired:
        return self._for(key).cancel_take(key, running, owner, ttl, now=now, request=request)

    def undo_cancel(self, key: JobKey, running: JobKey, owner: str,
                    request: str | None) -> bool:
        return self._for(key).undo_cancel(key, running, owner, request)

    # -- DebounceStore --------------------------------------------------------------------

    def debounce(self, key: JobKey, task_id: str, payload: str, *, now: float,
                 debounce_for: float, max_wait: float | None, ttl: float) -> Debounced:
        return self._for(key).debounce(key, task_id, payload, now=now,
                                       debounce_for=debounce_for, max_wait=max_wait, ttl=ttl)

    def claim_due(self, key: JobKey, message_id: str, *, now: float) -> Due:
        return self._for(key).claim_due(key, message_id, now=now)

    def withdraw(self, key: JobKey, task_id: str) -> bool:
        return self._for(key).withdraw(key, task_id)

    def get_debounce(self, key: JobKey) -> DebounceState | None:
        return self._for(key).get_debounce(key)

    # -- ThrottleStore --------------------------------------------------------------------

    def throttle_admit(self, key: JobKey, owner: str, *, delivery: str, concurrency: int,
                       rate_limit: int, rate_period: float, lease: float) -> Admission:
        return self._for(key).throttle_admit(
            key, owner, delivery=delivery, concurrency=concurrency, rate_limit=rate_limit,
            rate_period=rate_period, lease=lease)

    def throttle_release(self, key: JobKey, owner: str) -> bool:
        return self._for(key).throttle_release(key, owner)

    def throttle_renew(self, key: JobKey, owner: str, ttl: float, *, limit: int) -> Renewed:
        return self._for(key).throttle_renew(key, owner, ttl, limit=limit)

    def throttle_page(self, *, offset: int, limit: int, task_name: str = "",
                      search: str = "", now: float) -> Page[ThrottleState]:
        return _merged([shard.throttle_page(offset=0, limit=offset + limit,
                                            task_name=task_name, search=search, now=now)
                        for shard in self._shards()], offset, limit, key=None)

    # -- ListingStore ---------------------------------------------------------------------

    def iter_locks(self, *, batch_size: int = 500) -> Iterator[LockInfo]:
        return itertools.chain.from_iterable(
            shard.iter_locks(batch_size=batch_size) for shard in self._shards())

    def lock_page(self, *, offset: int, limit: int, task_name: str = "", search: str = "",
                  now: float) -> Page[LockInfo]:
        return _merged([shard.lock_page(offset=0, limit=offset + limit, task_name=task_name,
                                        search=search, now=now)
                        for shard in self._shards()], offset, limit,
                       key=lambda lock: (lock.expires_at is None, lock.expires_at or 0.0))

    def release_queued(self, key: JobKey, owner: str) -> bool:
        return self._for(key).release_queued(key, owner)

    def iter_debounces(self, *, batch_size: int = 500) -> Iterator[DebounceState]:
        return itertools.chain.from_iterable(
            shard.iter_debounces(batch_size=batch_size) for shard in self._shards())

    def debounce_page(self, *, offset: int, limit: int, task_name: str = "",
                      search: str = "", now: float) -> Page[DebounceState]:
        return _merged([shard.debounce_page(offset=0, limit=offset + limit,
                                            task_name=task_name, search=search, now=now)
                        for shard in self._shards()], offset, limit,
                       key=lambda state: state.runs_at)


def _merged(pages: list[Page[Any]], offset: int, limit: int, key: Any) -> Page[Any]:
    """Items ``offset`` to ``offset + limit`` of the shards' first pages, merged in the order
    each shard sorted them by (``key``; None: one shard after the other)."""
    items = list(heapq.merge(*(page.items for page in pages), key=key) if key
                 else itertools.chain.from_iterable(page.items for page in pages))
    totals = [page.total for page in pages]
    total = None if None in totals else sum(t or 0 for t in totals)
    more = any(page.has_more for page in pages) or len(items) > offset + limit
    return Page(items=items[offset:offset + limit], total=total, has_more=more)
