"""The generic Django-cache store: ``cache.add`` takes a lock ("must create", as Django's
cache session backend does). Atomic on locmem and memcached; the database and file caches
are accepted with a system-check warning; DummyCache is refused.

Release, renew and the worker check read then write (two cache calls): a lock that expires
between the two can be deleted or overwritten by its former owner. The django-redis and
database stores have no such window.
"""

from __future__ import annotations

from typing import Any

from django.core.cache import caches

from dedup_jobs.exceptions import StoreUnavailable
from dedup_jobs.keys import JobKey
from dedup_jobs.stores.base import QUEUED, RUNNING, Acquired, BaseStore, LockInfo, Started

NON_ATOMIC_BACKENDS = (
    "django.core.cache.backends.db.DatabaseCache",
    "django.core.cache.backends.filebased.FileBasedCache",
)
DUMMY_BACKEND = "django.core.cache.backends.dummy.DummyCache"
LOCAL_BACKEND = "django.core.cache.backends.locmem.LocMemCache"


def backend_path(cache: Any) -> str:
    return f"{type(cache).__module__}.{type(cache).__qualname__}"


class CacheStore(BaseStore):
    """Locks in any Django cache, as dicts: ``{"owner", "state", "acquired", "expires", ...}``."""

    cannot_list_reason = (
        "this cache cannot list its keys; use a django-redis cache or the database store "
        "to see held locks"
    )

    def __init__(self, alias: str) -> None:
        super().__init__(alias)
        self.cache: Any = caches[alias]
        path = backend_path(self.cache)
        self.atomic = path not in NON_ATOMIC_BACKENDS

    def _value(self, key: JobKey, owner: str, state: str, now: float, ttl: float,
               acquired: float | None = None) -> dict[str, Any]:
        return {
            "owner": owner, "state": state, "acquired": now if acquired is None else acquired,
            "expires": now + ttl, "task": key.task_name, "id": key.ident,
        }

    def acquire(
        self, key: JobKey, owner: str, ttl: float, *, now: float, reentrant: bool = False
    ) -> Acquired:
        for _ in range(5):
            if self.cache.add(key.key, self._value(key, owner, QUEUED, now, ttl), ttl):
                return Acquired(acquired=True, holder=owner)
            current = self.cache.get(key.key)
            if current is None:
                continue  # expired between add and get: try again
            if reentrant and current["owner"] == owner:
                self.cache.set(key.key, self._value(key, owner, QUEUED, now, ttl), ttl)
                return Acquired(acquired=True, holder=owner)
            return Acquired(acquired=False, holder=str(current["owner"]))
        raise StoreUnavailable(self.alias, f"lock {key.key!r} changed hands 5 times in a row")

    def start(
        self, key: JobKey, owner: str, lease: float, *, now: float, release: bool
    ) -> Started:
        current = self.cache.get(key.key)
        if current is not None and current["owner"] != owner:
            return Started(run=False, holder=str(current["owner"]))
        if release:
            if current is not None:
                self.cache.delete(key.key)
                return Started(run=True, holder=None, released=True)
            return Started(run=True, holder=None)
        if current is None:
            value = self._value(key, owner, RUNNING, now, lease)
            if not self.cache.add(key.key, value, lease):
                # Somebody took it in between: decide again on what is there now.
                return self.start(key, owner, lease, now=now, release=release)
            return Started(run=True, holder=None, took=True)
        value = self._value(key, owner, RUNNING, now, lease, acquired=current["acquired"])
        self.cache.set(key.key, value, lease)
        return Started(run=True, holder=None)

    def release(self, key: JobKey, owner: str) -> bool:
        current = self.cache.get(key.key)
        if current is None or current["owner"] != owner:
            return False
        self.cache.delete(key.key)
        return True

    def renew(self, key: JobKey, owner: str, ttl: float, *, now: float) -> bool:
        current = self.cache.get(key.key)
        if current is None or current["owner"] != owner:
            return False
        if current["expires"] < now + ttl:
            current = {**current, "expires": now + ttl}
            self.cache.set(key.key, current, ttl)
        return True

    def get(self, key: JobKey) -> LockInfo | None:
        current = self.cache.get(key.key)
        if current is None:
            return None
        return LockInfo(
            key=key.key, task_name=current["task"], ident=current["id"],
            owner=current["owner"], state=current["state"], acquired_at=current["acquired"],
            expires_at=current["expires"], store=self.alias,
        )
