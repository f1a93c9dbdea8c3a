"""Flow control on the generic cache store (R1 ``take_over``, R2 ``start_exclusive``), kept
apart from ``cache.py``. Each decision reads and writes under the store's short ``add``-based
mutex of the key, so it is as atomic as the cache's ``add`` (locmem, memcached); a lock
written by the plain :meth:`CacheStore.acquire` (``add``) needs no mutex to stay correct:
``add`` never overwrites."""

from __future__ import annotations

from typing import Any

from celery.utils import uuid

from dedup_jobs.keys import JobKey
from dedup_jobs.stores.base import QUEUED, RUNNING, Acquired, Started


class CacheFlowMixin:
    """``take_over`` and ``start_exclusive`` for :class:`CacheStore`."""

    cache: Any
    _mutex: Any
    _value: Any

    def take_over(self, key: JobKey, owner: str, ttl: float, *, now: float) -> Acquired:
        with self._mutex(key):
            current = self.cache.get(key.key)
            if current is not None and current["owner"] == owner:
                return Acquired(acquired=True, holder=owner,
                                replaced=current.get("replaced") or None)  # a re-send (S7)
            if current is not None and current["state"] == RUNNING:
                return Acquired(acquired=False, holder=str(current["owner"]))
            replaced = None if current is None else str(current["owner"])
            value = {**self._value(key, owner, QUEUED, now, ttl), "replaced": replaced or ""}
            if current is None:
                if not self.cache.add(key.key, value, ttl):  # a plain acquire took it
                    current = self.cache.get(key.key) or {}
                    return Acquired(acquired=False, holder=str(current.get("owner", "")))
            else:
                self.cache.set(key.key, value, ttl)
            return Acquired(acquired=True, holder=owner, replaced=replaced)

    def start_exclusive(
        self, key: JobKey, running: JobKey, owner: str, lease: float, *, now: float,
        delivery: str | None = None,
    ) -> Started:
        delivery = delivery or uuid()
        with self._mutex(key):
            marker = self.cache.get(running.key)
            if marker is not None and marker["owner"] == owner and marker.get("run") == delivery:
                return Started(run=True, holder=None, took=True)  # a re-send (S7)
            current = self.cache.get(key.key)
            if current is not None and current["owner"] != owner:
                return Started(run=False, holder=str(current["owner"]))
            if marker is not None:
                if marker["owner"] == owner:
                    return Started(run=False, holder=owner, live=True)
                return Started(run=False, holder=str(marker["owner"]), overlap=True)
            value = {**self._value(running, owner, RUNNING, now, lease), "run": delivery,
                     "took": True}
            if not self.cache.add(running.key, value, lease):
                taken = self.cache.get(running.key) or {}
                return Started(run=False, holder=str(taken.get("owner", "")), overlap=True)
            if current is not None:
                self.cache.delete(key.key)
            return Started(run=True, holder=None, took=True, released=current is not None)
