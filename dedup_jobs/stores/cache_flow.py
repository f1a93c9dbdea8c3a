"""Flow control on the generic cache store (R1 ``take_over``, R2 ``start_exclusive``), kept
apart from ``cache.py``. Each decision runs under the store's short ``add``-based mutex of the
key (so two take-overs or exclusive starts of a key never interleave) and through the store's
``calls``, so its cache calls share one STORE_TIMEOUT (S8) and, on memcached, every overwrite
or delete is guarded by the ``cas`` token of the read it decided on: a plain
:meth:`CacheStore.acquire` takes no mutex, and a lock that expired and was taken by ``add``
between the read and the write is decided on again, never overwritten. (``add`` itself never
overwrites.) Other caches have no ``cas``: there the write is a plain ``set``/``delete``, as
in the rest of the store."""

from __future__ import annotations

from typing import Any

from celery.utils import uuid

from dedup_jobs.exceptions import StoreUnavailable
from dedup_jobs.keys import JobKey
from dedup_jobs.stores.base import QUEUED, RUNNING, Acquired, Started

#: times a decision is tried when the lock changed under its cas-guarded write
ATTEMPTS = 5


class CacheFlowMixin:
    """``take_over`` and ``start_exclusive`` for :class:`CacheStore`."""

    alias: str
    calls: Any
    _mutex: Any
    _value: Any
    _in_time: Any
    deadline_ms: Any

    def take_over(
        self, key: JobKey, owner: str, ttl: float, *, now: float, request: str | None = None
    ) -> Acquired:
        calls = self.calls
        deadline = self.deadline_ms()
        with calls.decision(), self._mutex(key):
            for _ in range(ATTEMPTS):
                current, token = calls.gets(key.key)
                if current is not None and current["owner"] == owner:
                    return Acquired(acquired=True, holder=owner,
                                    replaced=current.get("replaced") or None)  # re-sent (S7)
                if current is not None and current["state"] == RUNNING:
                    return Acquired(acquired=False, holder=str(current["owner"]))
                replaced = None if current is None else str(current["owner"])
                self._in_time(deadline)  # S7: a late take-over changes nothing
                value = {**self._value(key, owner, QUEUED, now, ttl), "replaced": replaced or ""}
                if current is None:
                    if calls.add(key.key, value, ttl):
                        return Acquired(acquired=True, holder=owner)
                    continue  # a plain acquire took it in between: decide on that lock
                if calls.cas(key.key, value, token, ttl):
                    return Acquired(acquired=True, holder=owner, replaced=replaced)
                # changed or gone since the read (expired, taken by a plain acquire)
        raise StoreUnavailable(self.alias, f"lock {key.key!r} changed hands 5 times in a row")

    def start_exclusive(
        self, key: JobKey, running: JobKey, owner: str, lease: float, *, now: float,
        delivery: str | None = None,
    ) -> Started:
        delivery = delivery or uuid()
        calls = self.calls
        with calls.decision(), self._mutex(key):
            for _ in range(ATTEMPTS):
                marker = calls.get(running.key)
                if (marker is not None and marker["owner"] == owner
                        and marker.get("run") == delivery):
                    return Started(run=True, holder=None, took=True)  # a re-send (S7)
                current, token = calls.gets(key.key)
                if current is not None and current["owner"] != owner:
                    return Started(run=False, holder=str(current["owner"]))
                if marker is not None:
                    if marker["owner"] == owner:
                        return Started(run=False, holder=owner, live=True)
                    return Started(run=False, holder=str(marker["owner"]), overlap=True)
                value = {**self._value(running, owner, RUNNING, now, lease), "run": delivery,
                         "took": True}
                if not calls.add(running.key, value, lease):
                    continue  # another run took the marker in between: decide on it
                released = False
                if current is not None:
                    # ours: a lock taken meanwhile by another owner (ours expired) stays
                    released = bool(calls.cas_delete(key.key, token))
                return Started(run=True, holder=None, took=True, released=released)
        raise StoreUnavailable(self.alias, f"{running.key!r} changed hands 5 times in a row")
